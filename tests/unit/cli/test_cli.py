"""The command line in this process: argument errors, resolve round trip, schema and docs (exit codes,
tracebacks and light imports, in a process of its own: tests/commands/test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipeforge.cli import main
from recipeforge.config import load_recipe
from recipeforge.config.jsonschema import recipe_json_schema
from recipeforge.config.reference import recipe_reference_markdown
from rf_testing import MINIMAL

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def example_recipes() -> list[Path]:
    """Every runnable recipe under examples/ (fragments shared through `extends:` live in base/ folders;
    examples/axolotl holds another tool's configs, for `convert axolotl`)."""
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if "base" not in p.relative_to(EXAMPLES).parts[:-1]
                  and p.relative_to(EXAMPLES).parts[0] != "axolotl"
                  and p.name != "base.yaml")


def test_examples_exist_and_use_extends():
    recipes = example_recipes()
    assert len([p for p in recipes if p.parent.name == "yaml"]) >= 5
    assert all("extends" in yaml.safe_load(p.read_text()) for p in recipes if p.parent.name == "yaml")


@pytest.mark.parametrize("path", example_recipes(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_example_validates(path, capsys):
    assert main(["validate", str(path)]) == 0
    assert "ok:" in capsys.readouterr().out


@pytest.mark.parametrize("args, fragment", [
    (["validate", "missing.yaml"], "recipe file not found"),
    (["validate", "examples/yaml/qlora-70b.yaml", "train.learning_rate"], "is not key=value"),
])
def test_cli_argument_errors(args, fragment, capsys):
    assert main(args) == 2
    assert fragment in capsys.readouterr().err


def test_resolve_round_trips_with_overrides_and_interpolation(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RF_RUN_SUFFIX", "v2")
    src = tmp_path / "r.yaml"
    src.write_text(MINIMAL + "name: demo\noutput: {dir: 'runs/${name}-${env:RF_RUN_SUFFIX}'}\n")
    args = ["train.learning_rate=3e-4", "adapter.type=lora", "data.sequence_len=${train.global_batch_size}"]
    assert main(["resolve", str(src), *args]) == 0
    out = tmp_path / "resolved.yaml"
    out.write_text(capsys.readouterr().out)
    again = load_recipe(out).recipe
    original = load_recipe(src, args).recipe
    assert again == original
    assert again.output.dir == "runs/demo-v2" and again.data.sequence_len == 32
    assert again.train.learning_rate == 3e-4


@pytest.mark.parametrize("path", [p for p in example_recipes() if p.parent.name == "yaml"],
                         ids=lambda p: p.name)
def test_examples_round_trip(path, tmp_path):
    from recipeforge.config.dump import dump_recipe

    loaded = load_recipe(path)
    out = tmp_path / "resolved.yaml"
    out.write_text(dump_recipe(loaded))
    assert load_recipe(out).recipe == loaded.recipe


def test_schema_is_json_schema_with_extends(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    sft = schema["$defs"]["SFTRecipe"]
    assert sft["additionalProperties"] is False
    assert "extends" in sft["properties"] and "model" in sft["properties"]
    assert schema["discriminator"]["propertyName"] == "stage"


def test_docs_are_generated_from_the_current_schema():
    doc = (ROOT / "docs" / "recipes.md").read_text()
    assert doc == recipe_reference_markdown(), \
        "docs/recipes.md is stale: run `recipeforge schema --format markdown -o docs/recipes.md`"
    shipped = json.loads((ROOT / "docs" / "recipe.schema.json").read_text())
    assert shipped == recipe_json_schema(), \
        "docs/recipe.schema.json is stale: run `recipeforge schema -o docs/recipe.schema.json`"


def test_reference_covers_every_field():
    from recipeforge.config.schema import STAGE_CLASSES

    doc = recipe_reference_markdown()
    for cls in STAGE_CLASSES.values():
        for name in cls.model_fields:
            assert f"| `{name}` |" in doc


def test_plan_command_table_json_and_located_error(capsys):
    assert main(["plan", "examples/yaml/qlora-70b.yaml"]) == 0
    out = capsys.readouterr().out
    assert "Plan: single on 1xH100-80GB" in out and "Memory per GPU" in out
    assert main(["plan", "examples/yaml/qlora-70b.yaml", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "single" and data["micro_batch_size"] * data["gradient_accumulation"] == 16
    assert main(["plan", "examples/yaml/llama3-8b-full-sft.yaml", "--hardware", "1xL4-24GB"]) == 2
    err = capsys.readouterr().err
    assert "examples/yaml/llama3-8b-full-sft.yaml:6:3 model.name_or_path: " in err
    assert "does not fit" in err and "adapter.type: qlora" in err


def test_plan_takes_the_process_layout_train_takes(capsys):
    tiny = "examples/yaml/tiny/sft-full.yaml"
    assert main(["plan", tiny, "--nproc-per-node", "2", "--json"]) == 2  # the tiny recipes pin micro batch 8 of 8
    assert "global batch 8 is not a multiple of micro batch 8 x 2 data-parallel processes" in capsys.readouterr().err
    assert main(["plan", tiny, "train.micro_batch_size=auto", "--nproc-per-node", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["backend"], data["world_size"], data["data_parallel"]) == ("ddp", 2, 2)
    assert data["micro_batch_size"] * data["gradient_accumulation"] * 2 == data["global_batch_size"]
    # DeepSpeed runs on CPU processes (gloo) under `train`; `plan` says the same.
    assert main(["plan", tiny, "distributed.backend=deepspeed", "train.micro_batch_size=auto", "--nproc-per-node", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "deepspeed"


def test_plan_unknown_gpu_lists_known(capsys):
    assert main(["plan", "examples/yaml/qlora-70b.yaml", "--hardware", "8xH1OO-80GB"]) == 2
    assert "H100-80GB" in capsys.readouterr().err


def test_plugins_command_lists_every_group(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for group in ("models", "kernels", "rollout_engines", "rewards", "formats", "backends"):
        assert f"{group} (recipeforge.{group})" in out
    assert main(["plugins", "--json"]) == 0
    assert "rewards" in json.dumps(json.loads(capsys.readouterr().out)["groups"])


def test_trust_code_flag_is_the_opt_in(tmp_path, capsys, monkeypatch):
    # setenv first so that monkeypatch restores the variable (the flag sets it) after the test
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "")
    monkeypatch.delenv("RECIPEFORGE_TRUST_CODE")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(MINIMAL.replace("sft", "grpo").replace("alpaca", "prompt")
                      + "grpo: {num_generations: 4, rewards: [{name: 'my_rewards:score'}]}\n"
                        "train: {global_batch_size: 8}\n")
    assert main(["validate", str(recipe)]) == 2
    assert "--trust-code" in capsys.readouterr().err
    assert main(["--trust-code", "validate", str(recipe)]) == 0


def test_overrides_may_follow_flags(capsys):
    recipe = str(EXAMPLES / "yaml" / "tiny" / "sft-lora.yaml")
    assert main(["plan", recipe, "--json", "train.global_batch_size=32"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch_size"] == 32
    assert main(["plan", recipe, "train.global_batch_size=16", "--json", "train.global_batch_size=32"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch_size"] == 32  # the later override wins
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", recipe, "--no-such-flag"])
    assert exit_info.value.code == 2


def test_validate_refuses_qat_with_qlora_at_the_key(tmp_path, capsys):
    recipe = tmp_path / "qat.yaml"
    recipe.write_text(MINIMAL + "adapter:\n  type: qlora\ntrain:\n  qat:\n    scheme: int4_weight\n")
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"{recipe}:" in err and "train.qat" in err and "set adapter.type: none, or drop train.qat" in err
