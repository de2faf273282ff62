"""`recipeforge ui` against hostile requests and starts: paths out of the runs and recipes folders (`../`,
absolute, encoded, links out), an edit that extends a file elsewhere, a request without the key or with a
wrong one, and a bind beyond this machine without a key (refused before anything listens)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

pytest.importorskip("starlette.testclient")
from hostile_testing import REPO  # noqa: E402
from ui_testing import client, make_site  # noqa: E402

SECRET = "top-secret-value-42"
SFT = "tiny/sft-lora.yaml"


@pytest.fixture()
def site(tmp_path):
    site = make_site(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.yaml").write_text(f"stage: sft\ndescription: {SECRET}\n")
    (outside / "metrics.jsonl").write_text(f'{{"split": "train", "step": 1, "loss": 1.0, "note": "{SECRET}"}}\n')
    site["outside"] = outside
    return site


def _refused(response, status=403):
    assert response.status_code == status, (response.status_code, response.text)
    assert SECRET not in response.text and "Traceback" not in response.text
    return response.json()["error"]


TRAVERSALS = ["../outside", "../outside/secret.yaml", "/etc/passwd", "..", "done/../../outside", "~/x",
              "done\\..\\..\\outside", "done/\x00"]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_no_run_path_leaves_the_runs_folder(site, name):
    c = client(site)
    for url, params in (("/api/run", {"name": name}), ("/api/metrics", {"name": name}), ("/api/log", {"name": name}),
                        ("/api/diff", {"a": "done", "b": name})):
        error = _refused(c.get(url, params=params))
        assert error["message"]
    _refused(c.post("/api/stop", json={"name": name}))


@pytest.mark.parametrize("path", [*TRAVERSALS, "../outside/secret.yaml", "tiny/../../outside/secret.yaml"])
def test_no_recipe_path_leaves_the_recipes_folder(site, path):
    c = client(site)
    _refused(c.get("/api/recipe", params={"path": path}))
    for url in ("/api/check", "/api/save", "/api/launch", "/api/command"):
        _refused(c.post(url, json={"path": path, "text": "stage: sft\n", "name": "x"}))


def test_encoded_traversal_in_the_url_is_refused_too(site):
    c = client(site)
    for raw in ("/api/run?name=..%2Foutside", "/api/recipe?path=..%2Foutside%2Fsecret.yaml",
                "/api/recipe?path=%2Fetc%2Fpasswd"):
        _refused(c.get(raw))
    for asset in ("/assets/..%2Fapp.py", "/assets/../app.py", "/assets/%2e%2e/access.py", "/assets/index.html"):
        response = c.get(asset)
        assert response.status_code == 404 and "import" not in response.text, asset


def test_links_out_of_the_folders_are_refused(site):
    runs, recipes, outside = site["runs"], site["recipes"], site["outside"]
    os.symlink(outside, runs / "linked-run")
    os.symlink(outside / "secret.yaml", recipes / "linked.yaml")
    (runs / "done" / "resolved_recipe.yaml").unlink()
    os.symlink(outside / "secret.yaml", runs / "done" / "resolved_recipe.yaml")
    c = client(site)
    assert "link" in _refused(c.get("/api/run", params={"name": "linked-run"}))["message"]
    assert "link" in _refused(c.get("/api/recipe", params={"path": "linked.yaml"}))["message"]
    # A run whose record is a link out: refused, and listed as unreadable without its contents.
    assert "link" in _refused(c.get("/api/run", params={"name": "done"}))["message"]
    _refused(c.get("/api/metrics", params={"name": "done"}))
    listing = c.get("/api/runs")
    assert SECRET not in listing.text and "linked-run" not in listing.text
    assert {r["name"]: r["state"] for r in listing.json()["runs"]}["done"] == "unreadable"
    assert "linked.yaml" not in c.get("/api/recipes").json()["recipes"]


def test_an_edit_cannot_extend_a_file_outside_the_recipes_folder(site):
    c = client(site)
    text = (site["recipes"] / SFT).read_text()
    for ref in (str(site["outside"] / "secret.yaml"), "../../outside/secret.yaml"):
        edit = text.replace("extends: base.yaml", f"extends: [base.yaml, {ref}]")
        error = c.post("/api/check", json={"path": SFT, "text": edit}).json()["validate"]["error"]
        assert error["key"] == "extends" and error["line"] == 2 and SECRET not in str(error)
        _refused(c.post("/api/save", json={"path": SFT, "text": edit}), 400)
    assert (site["recipes"] / SFT).read_text() == text


def test_requests_without_the_key_or_with_a_wrong_one_are_refused(site):
    from starlette.testclient import TestClient

    c = client(site, key="the-right-key", local_only=False)
    for headers in ({}, {"Authorization": "Bearer the-wrong-key"}, {"Authorization": "the-right-key"},
                    {"Authorization": "Bearer the-right-key "}, {"Authorization": "Bearer the-right-ke"}):
        bare = TestClient(c.app, base_url="http://192.0.2.1:8765")
        for url in ("/api/runs", "/api/run?name=done", "/api/recipe?path=tiny/sft-lora.yaml"):
            assert bare.get(url, headers={**headers, "X-RecipeForge-Token": c.token}).status_code == 401, (headers, url)
        response = bare.post("/api/save", json={"path": SFT, "text": "x"}, headers={**headers, "X-RecipeForge-Token": c.token})
        assert response.status_code == 401
        assert bare.get("/", headers=headers).status_code == 401
    assert (site["recipes"] / SFT).read_text() != "x"
    assert TestClient(c.app, base_url="http://192.0.2.1:8765").post("/login", data={"key": ""}).status_code == 401


def test_a_bind_beyond_this_machine_needs_a_key(tmp_path):
    env = {"RECIPEFORGE_UI_KEY": ""}
    clean = {k: v for k, v in os.environ.items() if k != "RECIPEFORGE_UI_KEY"}
    for host in ("0.0.0.0", "::", "192.0.2.1", "my-host.example"):
        code, out, err = _run(tmp_path, ["ui", "runs", "--host", host, "--port", "0"], clean)
        assert code == 2 and err.startswith("error: --host") and "without a key" in err and "Traceback" not in err, err
        assert "RECIPEFORGE_UI_KEY" in err and out == ""
    # An empty key is no key: refused, never turned into a server without one.
    code, _, err = _run(tmp_path, ["ui", "runs", "--host", "0.0.0.0", "--port", "0"], {**clean, **env})
    assert code == 2 and "set but empty" in err
    code, _, err = _run(tmp_path, ["ui", "runs", "--host", "0.0.0.0", "--port", "0", "--key-env", "MY_UI_KEY"],
                        {**clean, "MY_UI_KEY": "a key"})
    assert code == 2 and "whitespace" in err
    assert not (tmp_path / "runs").exists()  # nothing created by a refused start


def _run(cwd, args, env):
    """`python -m recipeforge ARGS` as a real process with exactly `env` (plus this checkout on the path)."""
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *args], cwd=cwd, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_parent_on_disk_that_is_not_a_recipe_is_never_shown(site):
    not_a_recipe = site["outside"] / "passwd"
    not_a_recipe.write_text(f"root: {SECRET}\nuser: {SECRET}\n")
    (site["recipes"] / "tiny" / "sneaky.yaml").write_text(f"extends: [base.yaml, {not_a_recipe}]\nstage: sft\n")
    c = client(site)
    opened = c.get("/api/recipe", params={"path": "tiny/sneaky.yaml"})
    assert opened.status_code == 200 and SECRET not in opened.text
    assert [p["file"] for p in opened.json()["chain"]] == ["tiny/base.yaml"]
    text = opened.json()["text"]
    checked = c.post("/api/check", json={"path": "tiny/sneaky.yaml", "text": text})
    error = checked.json()["validate"]["error"]
    assert SECRET not in checked.text and error["key"] == "extends" and error["line"] == 1


INJECTIONS = ["3\ntrain:\n  max_steps: 99", "x\nallow_code: true", "a: b", "x\n  evil: 1", "1 # comment\nevil: 2",
              "}{][", "&a x", "*a", "!!python/object/apply:os.system ['id']", "x\r\nallow_code: true",
              "x\u2028allow_code: true", "x\x85allow_code: true", "'\"", "\\\"\nevil: 1", "--- \nevil: 1", "...",
              "x" * 100_001]
HOSTILE_KEYS = ["description\nallow_code", "description: x", "allow_code: true\ndescription", "__proto__",
                "train.max_steps\n", "train.max_steps=1", "train[0]", "a.b.c.d.e.f.g.h.i.j.k.l.m.n" * 30,
                "../description", "train .max_steps", "data.datasets.0.path"]


@pytest.mark.parametrize("value", INJECTIONS)
def test_a_form_value_cannot_add_or_change_other_keys(site, value):
    """Whatever text a field sends, the recipe gains no key and loses none: it is one quoted value."""
    from recipeforge.config.load import load_yaml_text

    c = client(site)
    text = (site["recipes"] / SFT).read_text()
    before = load_yaml_text(text).data
    for key in ("description", "model.name_or_path", "train.learning_rate", "output.resume"):
        response = c.post("/api/set_key", json={"path": SFT, "text": text, "key": key, "value": value})
        if response.status_code != 200:  # refused (a value longer than a recipe may hold): said so, no traceback
            error = _refused(response, 400)
            assert len(value) > 100_000 and "characters" in error["message"] + str(error.get("problems")), error
            continue
        after = load_yaml_text(response.json()["text"]).data
        expected = copy.deepcopy(before)
        section, _, name = key.rpartition(".")
        (expected.setdefault(section, {}) if section else expected)[name] = value
        assert after == expected, (key, value)
        assert "allow_code" not in after and "evil" not in str(after.keys())


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_a_form_key_is_a_key_of_the_schema_or_refused(site, key):
    c = client(site)
    text = (site["recipes"] / SFT).read_text()
    response = c.post("/api/set_key", json={"path": SFT, "text": text, "key": key, "value": "x"})
    error = _refused(response, 400)
    assert error["key"] in ("key", key) and error["message"]
