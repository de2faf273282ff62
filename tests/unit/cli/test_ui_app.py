"""recipeforge/cli/ui_server in this process (Starlette's TestClient, no process started): the runs page's
records (status, metrics from an offset, plan, resolved recipe, eval scores, the diff of two runs), the
editor (located errors of an unsaved edit, the plan for a chosen --hardware, saving), the launch command as
an argument list, and the page token and key checked on every request."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

pytest.importorskip("starlette.testclient")
from ui_testing import client, make_site  # noqa: E402

SFT = "tiny/sft-lora.yaml"


@pytest.fixture()
def site(tmp_path):
    return make_site(tmp_path, overrides=("train.max_steps=7",))


def test_runs_are_listed_with_their_status_from_the_run_directory(site):
    c = client(site)
    runs = {r["name"]: r for r in c.get("/api/runs").json()["runs"]}
    assert set(runs) == {"done", "other"}
    assert runs["done"]["state"] == "finished" and runs["done"]["stage"] == "sft"
    # No lock holder, no final/, no checkpoint, no exit status known: it ended without saving (`mcp` status).
    assert runs["other"]["state"] == "failed" and runs["other"]["last_step"] == 6 and runs["other"]["last_loss"] == 2.0
    # A run that left a checkpoint is resumable ("stopped": the cause of its end is not known here).
    (site["runs"] / "other" / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    other = next(r for r in c.get("/api/runs").json()["runs"] if r["name"] == "other")
    assert other["state"] == "stopped" and other["resumable"] is True


def test_metrics_come_from_an_offset_so_a_chart_gains_only_new_points(site):
    c = client(site)
    first = c.get("/api/metrics", params={"name": "other", "since": 0}).json()
    train = [r for r in first["rows"] if r["split"] == "train"]
    assert [r["step"] for r in train] == [2, 4, 6] and [r["loss"] for r in train] == [3.0, 2.5, 2.0]
    assert first["next"] == 5
    with open(site["runs"] / "other" / "metrics.jsonl", "a") as fh:  # the run logs another step
        fh.write(json.dumps({"split": "train", "step": 8, "loss": 1.5, "learning_rate": 0.005}) + "\n")
        fh.write('{"split": "train", "step": 9, "lo')  # a row being written: left out until complete
    more = c.get("/api/metrics", params={"name": "other", "since": first["next"]}).json()
    assert more["rows"] == [{"split": "train", "step": 8, "loss": 1.5, "learning_rate": 0.005}]
    assert more["next"] == 6 and more["partial_last_line"] is True


def test_a_run_shows_its_recipe_plan_and_eval_scores(site):
    run = site["runs"] / "done"
    (run / "plan.json").write_text(json.dumps({"backend": "single", "world_size": 1}))
    (run / "eval").mkdir()
    (run / "eval" / "tiny_task.json").write_text(json.dumps({"task": "tiny_task", "scores": {"acc": 0.75}}))
    detail = client(site).get("/api/run", params={"name": "done"}).json()
    assert detail["status"]["state"] == "finished" and detail["plan"]["backend"] == "single"
    assert "stage: sft" in detail["resolved_recipe"] and "lora" in detail["resolved_recipe"]
    assert detail["report"]["status"] == "finished" and detail["report"]["eval"] == {"tiny_task": {"acc": 0.75}}
    assert detail["started_here"] is False


def test_the_diff_of_two_runs_is_what_diff_json_prints(site):
    from recipeforge.cli.recipes import diff_record

    got = client(site).get("/api/diff", params={"a": "done", "b": "other"}).json()
    assert got == json.loads(json.dumps(diff_record(str(site["runs"] / "done"), str(site["runs"] / "other")),
                                        default=str))
    assert not got["equal"] and any("max_steps" in line for line in got["recipe"])


def test_the_editor_opens_a_recipe_with_its_extends_chain(site):
    c = client(site)
    assert SFT in c.get("/api/recipes").json()["recipes"]
    opened = c.get("/api/recipe", params={"path": SFT}).json()
    assert opened["text"] == (site["recipes"] / SFT).read_text()
    assert [p["file"] for p in opened["chain"]] == ["tiny/base.yaml"] and opened["chain"][0]["editable"]
    assert "tiny:llama" in opened["chain"][0]["text"]


def test_an_unsaved_edit_is_checked_with_the_clis_located_errors(site):
    c = client(site)
    text = (site["recipes"] / SFT).read_text()
    line = text.splitlines().index("  learning_rate: 1.0e-2") + 1
    broken = text.replace("learning_rate: 1.0e-2", "learning_rate: fast")
    error = c.post("/api/check", json={"path": SFT, "text": broken}).json()["validate"]["error"]
    assert error["location"].endswith(f"sft-lora.yaml:{line}:3") and error["key"] == "train.learning_rate"
    assert error["line"] == line and "expected a number" in error["message"]
    assert (site["recipes"] / SFT).read_text() == text  # checking writes nothing
    # The CLI on the same text says the same (validate --json's error record).
    from recipeforge.cli.mcp_server import records

    broken_file = site["recipes"] / "tiny" / "broken.yaml"
    broken_file.write_text(broken)
    cli = records.as_data(records.validate, records.recipe_namespace("validate", str(broken_file)))["error"]
    assert (cli["message"], cli["key"], cli["location"].rsplit(":", 2)[1:]) == \
        (error["message"], error["key"], error["location"].rsplit(":", 2)[1:])
    # A syntax error: at its line too.
    syntax = c.post("/api/check", json={"path": SFT, "text": text + "train: [\n"}).json()["validate"]["error"]
    assert syntax["line"] >= len(text.splitlines())


def test_a_valid_edit_is_planned_for_the_chosen_hardware(site):
    c = client(site)
    text = (site["recipes"] / SFT).read_text().replace("learning_rate: 1.0e-2", "learning_rate: 2.0e-2")
    got = c.post("/api/check", json={"path": SFT, "text": text, "hardware": "1xH100-80GB"}).json()
    assert got["validate"]["ok"] and got["validate"]["stage"] == "sft"
    assert got["plan"]["text"].startswith("Plan: single on 1xH100-80GB") and "Memory per GPU" in got["plan"]["text"]
    assert got["plan"]["plan"]["world_size"] == 1
    # On 8 GPUs the tiny global batch of 8 cannot hold micro 8 per rank: the planner's error, located in
    # the parent recipe that sets it.
    eight = c.post("/api/check", json={"path": SFT, "text": text, "hardware": "8xH100-80GB"}).json()["plan"]["error"]
    assert eight["key"] == "train.micro_batch_size" and eight["location"].endswith("base.yaml:12:3")
    bad = c.post("/api/check", json={"path": SFT, "text": text, "hardware": "lots of GPUs"}).json()
    assert "error" in bad["validate"] and bad["plan"] is None
    own = c.post("/api/check", json={"path": SFT, "text": text, "overrides": "train.max_steps=3"}).json()
    assert "cpu" in own["plan"]["text"].lower()


def test_save_writes_the_edit_and_refuses_turning_on_allow_code(site):
    c = client(site)
    path = site["recipes"] / SFT
    text = path.read_text().replace("learning_rate: 1.0e-2", "learning_rate: 2.0e-2")
    assert c.post("/api/save", json={"path": SFT, "text": text}).json()["saved"]
    assert path.read_text() == text
    coded = text + "allow_code: true\n"
    refused = c.post("/api/save", json={"path": SFT, "text": coded})
    assert refused.status_code == 400 and refused.json()["error"]["key"] == "allow_code"
    assert refused.json()["error"]["location"].endswith(f":{len(coded.splitlines())}:1")
    assert path.read_text() == text
    checked = c.post("/api/check", json={"path": SFT, "text": coded}).json()["validate"]["error"]
    assert checked["key"] == "allow_code" and "--trust-code" in checked["hint"]
    # A server started with --trust-code leaves that decision to the recipe.
    trusted = client(site, trust_code=True)
    assert trusted.post("/api/save", json={"path": SFT, "text": coded}).json()["saved"]


def test_the_launch_command_is_an_argument_list_into_the_runs_folder(site):
    c = client(site)
    got = c.post("/api/command", json={"path": SFT, "name": "try-1",
                                       "overrides": "train.max_steps=2; rm -rf ~\ntrain.seed=3"}).json()
    argv = got["argv"]
    assert argv[:4] == [sys.executable, "-m", "recipeforge", "train"] and argv[4].endswith("sft-lora.yaml")
    # A value is one argument, never shell text; the run goes to RUNS_DIR/<name>.
    assert argv[5:] == ["train.max_steps=2; rm -rf ~", "train.seed=3", f"output.dir={site['runs'].resolve() / 'try-1'}"]
    assert got["command_line"].startswith(sys.executable) and "'train.max_steps=2; rm -rf ~'" in got["command_line"]
    for name in ("../x", "a/b", ".hidden", "", "x" * 200):
        assert c.post("/api/command", json={"path": SFT, "name": name}).status_code in (400, 403), name
    for bad in ("--trust-code", "allow_code=true"):
        refused = c.post("/api/command", json={"path": SFT, "name": "x", "overrides": bad})
        assert refused.status_code == 400, bad


def test_the_api_needs_the_pages_token_and_this_machines_host(site):
    c = client(site)
    assert c.get("/api/runs", headers={"X-RecipeForge-Token": "wrong"}).status_code == 403
    from starlette.testclient import TestClient

    bare = TestClient(c.app, base_url="http://127.0.0.1:8765")
    assert bare.get("/api/runs").status_code == 403
    assert bare.post("/api/save", json={"path": SFT, "text": "x"}).status_code == 403
    # A DNS-rebinding page reaches 127.0.0.1 under its own name: refused.
    assert c.get("/api/runs", headers={"Host": "attacker.example:8765"}).status_code == 421
    # A POST from another site's page, even with a token: refused.
    assert c.post("/api/check", json={"path": SFT, "text": ""},
                  headers={"Origin": "http://attacker.example"}).status_code == 403
    assert c.post("/api/check", json={"path": SFT, "text": ""}, headers={"Origin": "http://127.0.0.1:8765"}).status_code == 200
    # State changes are POSTs only.
    assert c.get("/api/save", params={"path": SFT, "text": ""}).status_code == 405


def test_with_a_key_every_request_carries_it(site):
    c = client(site, key="s3cret-key")
    assert c.get("/api/runs").status_code == 200
    from starlette.testclient import TestClient

    bare = TestClient(c.app, base_url="http://127.0.0.1:8765")
    page = bare.get("/")
    assert page.status_code == 401 and "s3cret-key" not in page.text and "recipeforge-token" not in page.text
    assert bare.get("/assets/app.js").status_code == 401
    assert bare.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert bare.get("/api/runs", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
    assert bare.post("/login", data={"key": "wrong"}).status_code == 401
    logged = bare.post("/login", data={"key": "s3cret-key"}, follow_redirects=False)
    assert logged.status_code == 303
    cookie = logged.cookies.get("recipeforge_ui_session")
    assert cookie and "s3cret-key" not in cookie
    bare.cookies.set("recipeforge_ui_session", cookie)
    assert bare.get("/").status_code == 200


def test_the_page_and_its_chart_library_are_served_from_the_package(site):
    c = client(site)
    page = c.get("/").text
    assert 'src="/assets/chart.min.js"' in page and "http" not in page.split("<body>")[0].replace("http-equiv", "")
    chart = c.get("/assets/chart.min.js")
    assert chart.status_code == 200 and "Chart.js v3.9.1" in chart.text[:200]
    assert "MIT" in c.get("/assets/LICENSE.chart.js.txt").text
    assert c.get("/assets/index.html").status_code == 404  # only the listed assets


def test_the_recipe_list_leaves_out_run_directories(tmp_path):
    site = make_site(tmp_path)
    site["runs"] = site["recipes"] / "runs"  # the default layout: runs/ under the recipes folder
    shutil.copytree(tmp_path / "runs", site["runs"])
    listed = client(site).get("/api/recipes").json()["recipes"]
    assert SFT in listed and not any(name.startswith("runs/") for name in listed), listed
