"""ORPO, KTO and CPO/SimPO: TRL's trainers found wherever the installed release keeps them, their
configs built from the recipe, and KTO's unpaired data checked row by row."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.outputs.run_dir import RunDir
from recipeforge.stages import runner_class
from recipeforge.stages.base import RecipeContext, StageContext

TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def _runner(name, tmp_path, *overrides, plan=True):
    from recipeforge.components.kernels import apply_kernels
    from recipeforge.plan import make_plan

    path = name if isinstance(name, Path) else TINY / f"{name}.yaml"
    loaded = load_recipe(path, overrides=[f"data.cache_dir={tmp_path / 'cache'}", *overrides])
    ctx = (StageContext(loaded=loaded, plan=make_plan(loaded.recipe), run=RunDir(tmp_path / "run")) if plan
           else RecipeContext(loaded=loaded))
    runner = runner_class(loaded.recipe.stage)(ctx)
    runner.kernels = apply_kernels(loaded.recipe.kernels, "cpu")
    runner.tokenizer = runner.load_tokenizer()
    return runner


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("method", ["ORPO", "CPO", "KTO"])
def test_trl_classes_avoid_deprecated_import_paths(method, tmp_path):
    from recipeforge.stages.trl_preference import trl_classes

    config_cls, trainer_cls = trl_classes(method)
    assert config_cls.__name__ == f"{method}Config" and trainer_cls.__name__ == f"{method}Trainer"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config_cls(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    # TRL's wrapper at a deprecated place warns when it is built: "update your imports".
    assert not [w for w in caught if "import" in str(w.message).lower()], [str(w.message) for w in caught]


def test_a_trl_without_the_trainer_is_a_clear_error(monkeypatch):
    from recipeforge.stages import trl_preference

    monkeypatch.setitem(trl_preference.TRL_LOCATIONS, "ORPO", ("trl", "trl.no_such_module"))
    with pytest.raises(RecipeError) as err:
        trl_preference.trl_classes("ORPO", stage="orpo")
    p = err.value.problems[0]
    assert p.key == "stage" and "ORPOTrainer" in p.message and "trl 1." in p.message
    assert "trl.no_such_module" in p.message and "trl>=1.0" in p.hint


def test_simpo_config_has_no_nll_term_and_no_default_length_cut(tmp_path):
    args = _runner("simpo", tmp_path).trainer_config()
    assert (args.loss_type, args.cpo_alpha, args.simpo_gamma, args.beta) == ("simpo", 0.0, 0.5, 2.0)
    assert args.max_length == 128 and args.max_completion_length is None
    args = _runner("simpo", tmp_path, "cpo.loss_type=sigmoid", "data.sequence_len=64").trainer_config()
    assert (args.loss_type, args.cpo_alpha, args.max_length) == ("sigmoid", 1.0, 64)


def test_orpo_and_kto_configs(tmp_path):
    args = _runner("orpo", tmp_path, "orpo.beta=0.25").trainer_config()
    assert (args.beta, args.max_length, args.use_cpu, args.bf16) == (0.25, 128, True, False)
    args = _runner("kto", tmp_path, "kto.desirable_weight=1.33", "data.shuffle=true").trainer_config()
    assert (args.desirable_weight, args.undesirable_weight, args.max_length) == (1.33, 1.0, 128)
    assert args.train_sampling_strategy == "sequential"  # KTO's KL pairs neighbouring rows


def test_cpo_label_smoothing_needs_a_sigmoid_loss(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY / "simpo.yaml", overrides=["cpo.loss_type=hinge", "cpo.label_smoothing=0.1"])
    assert "label_smoothing applies to the sigmoid and simpo losses" in str(err.value)


def test_kto_reads_unpaired_rows_and_unpairs_preference_pairs(tmp_path):
    runner = _runner("kto", tmp_path, "data.val_size=0", "data.shuffle=false")
    runner.data = runner.prepare_data()
    assert runner.data_stats["desirable_rows"] == runner.data_stats["undesirable_rows"] == 48
    pref = TINY.parents[1] / "data" / "preference.jsonl"
    runner = _runner("kto", tmp_path, "data.val_size=0", "data.shuffle=false",
                     f"data.datasets=[{{path: {pref}, format: preference}}]")
    runner.data = runner.prepare_data()
    rows = runner.train_rows
    first = json.loads(pref.read_text().splitlines()[0])
    assert len(rows) == 96 and rows.column_names == ["prompt", "completion", "label"]
    assert rows[0] == {"prompt": first["prompt"], "completion": first["chosen"], "label": True}
    assert rows[1] == {"prompt": first["prompt"], "completion": first["rejected"], "label": False}


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "completion": "c", "label": "no"}],
     "row 2: column 'label' must be true (desirable) or false (undesirable), got 'no'"),
    ([{"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "completion": "c", "label": 0}],
     "row 2: column 'label' must be true (desirable) or false (undesirable), got 0"),
    ([{"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "label": False}],
     "row 2: column 'completion' is empty"),
])
def test_kto_row_errors_name_dataset_row_and_column(tmp_path, rows, message):
    data = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "x", "completion": "y", "label": False}] * 3 + rows)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"extends: {TINY / 'kto.yaml'}\ndata:\n  val_size: 0\n  datasets:\n"
                      f"    - path: {TINY.parents[1] / 'data' / 'unpaired.jsonl'}\n      format: unpaired\n"
                      f"    - path: {data}\n      format: unpaired\n")
    runner = _runner(recipe, tmp_path)
    with pytest.raises(RecipeError) as err:
        runner.data = runner.prepare_data()
    p = err.value.problems[0]
    assert p.key == "data.datasets[1]" and message.replace("row 2", "row 5") in p.message and str(data) in p.message
    assert (Path(p.location.file), p.location.line) == (recipe, 7)  # the dataset's `path:` line


@pytest.mark.parametrize("label, word", [(True, "desirable (label true)"), (False, "undesirable (label false)")])
def test_kto_needs_both_kinds_of_rows(tmp_path, label, word):
    data = _jsonl(tmp_path / "one.jsonl", [{"prompt": "q", "completion": f"a{i}", "label": label} for i in range(8)])
    runner = _runner("kto", tmp_path, "data.val_size=0", f"data.datasets=[{{path: {data}, format: unpaired}}]")
    with pytest.raises(RecipeError) as err:
        runner.data = runner.prepare_data()
    p = err.value.problems[0]
    assert p.key == "data.datasets[0]" and f"every training row is {word}" in p.message
    assert f"label {str(not label).lower()}" in p.hint


def test_kto_refuses_micro_batches_of_one(tmp_path):
    """The recipe rules and the planner never give KTO a micro batch of one (tests/commands/
    test_stage_micro_batch.py); a plan edited by hand still stops here, before any step."""
    from dataclasses import replace

    with pytest.raises(RecipeError, match="KTO needs micro batches of 2 or more rows"):
        _runner("kto", tmp_path, "train.micro_batch_size=1")
    runner = _runner("kto", tmp_path, "train.micro_batch_size=2")
    runner.ctx = replace(runner.ctx, plan=replace(runner.ctx.plan, micro_batch_size=1))
    with pytest.raises(RecipeError) as err:
        runner.check()
    p = err.value.problems[0]
    assert p.key == "train.micro_batch_size" and "2 or more" in p.message and p.location is not None


def test_kto_reference_model(tmp_path):
    assert _runner("kto", tmp_path).reference_model() is None  # LoRA: the base with adapters disabled
    runner = _runner("kto", tmp_path, "adapter.type=none")
    ref = runner.reference_model()
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
