"""The recipe editor's form (recipeforge/cli/ui_server/form.py, yaml_edit.py) in this process: the fields of a
recipe's stage as the recipe's JSON Schema describes them, the values the recipe resolves to and the keys its
file sets, and one key set in the YAML text (typed by its schema, the rest of the text kept)."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette.testclient")
from ui_testing import client, make_site  # noqa: E402

from recipeforge.config.load import load_yaml_text  # noqa: E402

SFT = "tiny/sft-lora.yaml"


@pytest.fixture()
def site(tmp_path):
    return make_site(tmp_path)


@pytest.fixture()
def c(site):
    return client(site)


def _fields(sections):
    out = {}

    def walk(items):
        for f in items:
            out[f["key"]] = f
            walk(f.get("fields", ()))

    walk(sections)
    return out


def _schema_property(schema, recipe_def, dotted):
    """The schema's own property record for `dotted` (following $ref and anyOf-with-null)."""
    node = schema["$defs"][recipe_def]
    prop = None
    for part in dotted.split("."):
        prop = node["properties"][part]
        target = prop
        for alt in prop.get("anyOf", ()):
            if "$ref" in alt:
                target = alt
        node = schema["$defs"][target["$ref"].rsplit("/", 1)[-1]] if "$ref" in target else target
    return prop


def _set(c, text, key, value, path=SFT):
    response = c.post("/api/set_key", json={"path": path, "text": text, "key": key, "value": value})
    return response


def test_the_form_has_the_fields_of_the_recipes_stage_as_the_schema_describes_them(site, c):
    from recipeforge.config.jsonschema import recipe_json_schema

    schema = recipe_json_schema()
    text = (site["recipes"] / SFT).read_text()
    got = c.post("/api/form", json={"path": SFT, "text": text}).json()
    assert got["stage"] == "sft" and got["resolved"] is True
    sections = [s["key"] for s in got["sections"]]
    assert sections[0] == "" and {"model", "adapter", "data", "train", "output", "hardware"} <= set(sections)
    assert "dpo" not in sections and "grpo" not in sections  # the sections of other stages
    fields = _fields(got["sections"])
    kinds = {key: fields[key]["kind"] for key in ("train.learning_rate", "train.max_steps", "train.optimizer",
                                                  "adapter.use_rslora", "data.datasets", "adapter.quant",
                                                  "train.micro_batch_size", "train.gradient_checkpointing",
                                                  "hardware.gpus_per_node", "model.name_or_path", "stage")}
    assert kinds == {"train.learning_rate": "number", "train.max_steps": "integer", "train.optimizer": "enum",
                     "adapter.use_rslora": "boolean", "data.datasets": "readonly", "adapter.quant": "group",
                     "train.micro_batch_size": "text", "train.gradient_checkpointing": "enum",
                     "hardware.gpus_per_node": "integer", "model.name_or_path": "string", "stage": "enum"}
    # Help text and choices are the schema's own; anyOf with null makes a field optional.
    for key in ("train.learning_rate", "train.optimizer", "adapter.quant.bits", "hardware.gpus_per_node", "model"):
        assert fields[key]["help"] == _schema_property(schema, "SFTRecipe", key)["description"], key
    assert fields["train.optimizer"]["options"] == _schema_property(schema, "SFTRecipe", "train.optimizer")["enum"]
    assert fields["train.max_steps"]["nullable"] and not fields["train.learning_rate"]["nullable"]
    assert fields["train.gradient_checkpointing"]["options"] == ["auto", "selective", True, False]
    assert fields["adapter.quant.bits"]["options"] == [4, 8]  # a $ref'd section's enum of integers
    assert "YAML view" in fields["data.datasets"]["note"]
    # Values: what the recipe resolves to; `set` the file's own keys, `inherited` those from extends.
    assert got["values"]["train"]["learning_rate"] == 0.01 and got["values"]["train"]["max_steps"] == 40
    assert got["values"]["train"]["optimizer"] == "adamw"  # a default
    assert "train.learning_rate" in got["set"] and "train.max_steps" not in got["set"]
    assert "train.max_steps" in got["inherited"] and "train.optimizer" not in got["inherited"]


def test_the_form_follows_the_recipes_own_stage(site, c):
    text = (site["recipes"] / SFT).read_text().replace("stage: sft", "stage: dpo")
    got = c.post("/api/form", json={"path": SFT, "text": text}).json()
    assert got["stage"] == "dpo" and "dpo" in [s["key"] for s in got["sections"]]
    fields = _fields(got["sections"])
    assert fields["dpo.beta"]["kind"] == "number"
    # Not valid as DPO (chat data, no pairs): the merged values without defaults, marked so.
    assert got["resolved"] is False
    assert got["values"]["train"]["max_steps"] == 40 and "optimizer" not in got["values"]["train"]


def test_setting_an_existing_key_replaces_only_its_value(site, c):
    text = (site["recipes"] / SFT).read_text()
    got = _set(c, text, "train.learning_rate", "2e-3").json()
    assert got["value"] == 0.002 and got["key"] == "train.learning_rate"
    assert got["text"] == text.replace("  learning_rate: 1.0e-2", "  learning_rate: 0.002")
    checked = c.post("/api/check", json={"path": SFT, "text": got["text"]}).json()
    assert checked["validate"]["ok"] and checked["plan"]["text"].startswith("Plan:")


def test_a_new_key_goes_under_its_section_and_a_new_section_at_the_end(site, c):
    text = (site["recipes"] / SFT).read_text()
    lines = text.splitlines()
    got = _set(c, text, "train.max_steps", 12).json()["text"]
    at = lines.index("  learning_rate: 1.0e-2") + 1
    assert got.splitlines() == [*lines[:at], "  max_steps: 12", *lines[at:]]
    got = _set(c, text, "hardware.gpus_per_node", "2").json()["text"]
    assert got == text + "hardware:\n  gpus_per_node: 2\n"
    got = _set(c, text, "adapter.quant.bits", "4").json()["text"]  # a new sub-section inside a section
    at = lines.index("  modules_to_save: [lm_head]") + 1
    assert got.splitlines() == [*lines[:at], "  quant:", "    bits: 4", *lines[at:]]
    assert load_yaml_text(got).data["adapter"]["quant"] == {"bits": 4}


@pytest.mark.parametrize("key, given, value, line", [
    ("train.optimizer", "sgd", "sgd", "  optimizer: sgd"),
    ("train.gradient_checkpointing", True, True, "  gradient_checkpointing: true"),
    ("train.gradient_checkpointing", "selective", "selective", "  gradient_checkpointing: selective"),
    ("train.micro_batch_size", "4", 4, "  micro_batch_size: 4"),
    ("train.micro_batch_size", "auto", "auto", "  micro_batch_size: auto"),
    ("adapter.use_rslora", True, True, "  use_rslora: true"),
    ("adapter.use_rslora", "false", False, "  use_rslora: false"),
    ("train.learning_rate", "1e-5", 1e-5, "  learning_rate: 1.0e-05"),
    ("train.max_steps", "", None, "  max_steps: null"),
    ("train.max_steps", 7.0, 7, "  max_steps: 7"),
    ("name", "123", "123", 'name: "123"'),  # a string field keeps a number-like text as text
    ("name", "true", "true", 'name: "true"'),
    ("model.name_or_path", "tiny:llama", "tiny:llama", "  name_or_path: tiny:llama"),
    ("train.learning_rate", "fast", "fast", "  learning_rate: fast"),  # wrong kind: validation reports it
])
def test_values_are_typed_by_the_schema(site, c, key, given, value, line):
    text = (site["recipes"] / SFT).read_text()
    got = _set(c, text, key, given).json()
    assert got["value"] == value and type(got["value"]) is type(value)
    assert line in got["text"].splitlines()
    data = load_yaml_text(got["text"]).data
    here = data
    for part in key.split("."):
        here = here[part]
    assert here == value and type(here) is type(value)


def test_a_wrongly_typed_value_is_reported_at_its_field_key(site, c):
    text = (site["recipes"] / SFT).read_text()
    got = _set(c, text, "train.max_steps", "0").json()["text"]
    error = c.post("/api/check", json={"path": SFT, "text": got}).json()["validate"]["error"]
    assert error["key"] == "train.max_steps" and error["line"] == got.splitlines().index("  max_steps: 0") + 1


def test_a_key_the_schema_does_not_have_is_refused_at_its_place(site, c):
    text = (site["recipes"] / SFT).read_text()
    refused = _set(c, text, "train.max_stepz", 3)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["key"] == "train.max_stepz"
    assert "not a key of a sft recipe" in error["message"] and "train.max_steps" in error["hint"]
    assert error["location"].endswith(f"sft-lora.yaml:{text.splitlines().index('train:') + 1}:1")
    for key in ("dpo.beta", "nonsense", "train", "data.datasets", "train.max_steps.x", "train[0]", "", None, 5,
                "train..max_steps"):
        response = _set(c, text, key, 3)
        assert response.status_code == 400 and "error" in response.json(), key
    assert _set(c, text, "train.max_steps", [1, 2]).status_code == 400
    assert _set(c, text, "train.learning_rate", None).status_code == 400  # not optional


def test_special_characters_stay_one_value_and_comments_stay(site, c):
    text = (site["recipes"] / SFT).read_text()
    before = load_yaml_text(text).data
    for value in ("a: b", "x\ny: 1", "#not a comment", "- item", "{a: 1}", '"quoted" \\ back', "  spaced  ",
                  "\u2028line", "*alias", "&anchor x", "!!python/object:os.system", "tab\there", "--- x"):
        got = _set(c, text, "description", value).json()
        assert got["value"] == value
        after = load_yaml_text(got["text"]).data
        assert after == {**before, "description": value}, value
        assert len(got["text"].splitlines()) == len(text.splitlines())
        comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
        assert all(line in got["text"].splitlines() for line in comments)


def test_an_empty_or_null_section_and_a_flow_mapping_take_the_key(site, c):
    recipes = site["recipes"] / "tiny"
    (recipes / "flow.yaml").write_text("extends: base.yaml  # the base\nstage: sft\ntrain: {seed: 3}\n"
                                       "output:\n# nothing here yet\ndata: {datasets: [{path: ../../data/sft-chat.jsonl,"
                                       " format: messages}]}\n")
    text = (recipes / "flow.yaml").read_text()
    got = _set(c, text, "train.max_steps", 5, "tiny/flow.yaml").json()["text"]
    assert "train: {seed: 3, max_steps: 5}" in got
    got = _set(c, got, "output.save_steps", 10, "tiny/flow.yaml").json()["text"]
    assert "output:\n  save_steps: 10\n# nothing here yet\n" in got and "extends: base.yaml  # the base" in got
    data = load_yaml_text(got).data
    assert data["train"] == {"seed": 3, "max_steps": 5} and data["output"] == {"save_steps": 10}


def test_the_new_endpoints_keep_the_access_rules(site):
    c = client(site)
    text = (site["recipes"] / SFT).read_text()
    from starlette.testclient import TestClient

    bare = TestClient(c.app, base_url="http://127.0.0.1:8765")
    for url in ("/api/form", "/api/set_key"):
        body = {"path": SFT, "text": text, "key": "train.max_steps", "value": 3}
        assert bare.post(url, json=body).status_code == 403
        assert c.post(url, json=body, headers={"Host": "attacker.example:8765"}).status_code == 421
        assert c.post(url, json=body, headers={"Origin": "http://attacker.example"}).status_code == 403
        assert c.get(url, params={"path": SFT}).status_code == 405
        assert c.post(url, json={**body, "path": "../outside.yaml"}).status_code == 403
    keyed = client(site, key="k3y")
    no_key = TestClient(keyed.app, base_url="http://127.0.0.1:8765")
    assert no_key.post("/api/set_key", json={"path": SFT, "text": text, "key": "train.max_steps", "value": 3},
                       headers={"X-RecipeForge-Token": keyed.token}).status_code == 401
    assert (site["recipes"] / SFT).read_text() == text  # setting a key writes nothing


def test_an_edit_extending_a_file_elsewhere_is_refused_before_the_form_reads_it(site, c, tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("stage: sft\ndescription: secret-value-9\n")
    text = (site["recipes"] / SFT).read_text().replace("extends: base.yaml", f"extends: {outside}")
    for url, extra in (("/api/form", {}), ("/api/set_key", {"key": "train.max_steps", "value": 3})):
        response = c.post(url, json={"path": SFT, "text": text, **extra})
        assert response.status_code == 400 and response.json()["error"]["key"] == "extends"
        assert "secret-value-9" not in response.text
