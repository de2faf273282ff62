"""No lost runs: a run directory is only continued by the recipe that started it.

`train` compares the resolved recipe's hash with the one the run directory keeps. A finished run is
never trained over without --overwrite; a changed recipe is shown as a diff and needs --force; a run
of another recipe (stage, model, adapter) can only be replaced with --overwrite.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recipeforge.cli import main
from recipeforge.outputs.run_guard import HASH_HEADER, recipe_diff, recipe_hash

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"


# ----------------------------------------------------------------------------- hash and diff

BASE = {"stage": "sft", "model": {"name_or_path": "tiny:llama"}, "train": {"learning_rate": 0.001, "seed": 1},
        "data": {"datasets": [{"path": "/d/a.jsonl", "format": "alpaca"}], "num_proc": 1},
        "output": {"dir": "/runs/a", "save_steps": 10}, "logging": {"progress_bar": True}}


def _with(data: dict, path: str, value) -> dict:
    import copy

    out = copy.deepcopy(data)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


@pytest.mark.parametrize("path, value", [
    ("output.save_steps", 50), ("output.dir", "/elsewhere"), ("logging.progress_bar", False),
    ("data.num_proc", 8), ("description", "a note"),
])
def test_run_neutral_keys_keep_the_hash(path, value):
    assert recipe_hash(_with(BASE, path, value)) == recipe_hash(BASE)
    assert recipe_diff(BASE, _with(BASE, path, value)) == []


def test_diff_names_every_changed_leaf():
    changed = _with(_with(BASE, "train.learning_rate", 0.0002), "train.weight_decay", 0.1)
    changed["data"]["datasets"][0]["path"] = "/d/b.jsonl"
    del changed["train"]["seed"]
    assert recipe_hash(changed) != recipe_hash(BASE)
    assert recipe_diff(BASE, changed) == [
        "data.datasets[0].path: /d/a.jsonl -> /d/b.jsonl",
        "train.learning_rate: 0.001 -> 0.0002",
        "train.seed: 1 -> (unset)",
        "train.weight_decay: (unset) -> 0.1",
    ]


# ----------------------------------------------------------------------------- the guard, end to end

def _train(tmp_path, capsys, recipe="pretrain", *extra):
    args = ["train", str(TINY / f"{recipe}.yaml"), f"output.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false", "train.max_steps=4",
            "output.save_steps=2", "data.val_size=0", *extra]
    flags = [a for a in args if a.startswith("--")]
    code = main([a for a in args if not a.startswith("--")] + flags)
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.slow
def test_overwrite_and_changed_recipe_guards(tmp_path, capsys):
    run = tmp_path / "run"
    code, err = _train(tmp_path, capsys)
    assert code == 0, err
    weights = run / "final" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert HASH_HEADER in (run / "resolved_recipe.yaml").read_text()

    # The same recipe again: the finished run is kept, not trained over.
    code, err = _train(tmp_path, capsys)
    assert code == 2 and "Traceback" not in err
    assert f"output.dir: run directory {run} already holds a finished run of this recipe" in err
    assert "hint: pass --overwrite to train it again from scratch" in err
    assert weights.stat().st_mtime_ns == stamp

    # An interrupted run (checkpoint-2 complete, nothing after) continued with a changed learning rate.
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "checkpoints" / "checkpoint-4")
    before = (run / "resolved_recipe.yaml").read_text()
    code, err = _train(tmp_path, capsys, "pretrain", "train.learning_rate=1e-3", "description=longer")
    assert code == 2 and "Traceback" not in err
    assert f"run directory {run} holds an unfinished run of a changed recipe:\n    " \
           "train.learning_rate: 0.003 -> 0.001\n" in err
    assert "description" not in err  # a note is not a change of the run
    assert "hint: pass --force to continue that run with the changed recipe" in err
    assert (run / "resolved_recipe.yaml").read_text() == before and not (run / "final").exists()

    code, err = _train(tmp_path, capsys, "pretrain", "train.learning_rate=1e-3", "--force")
    assert code == 0, err
    assert "resuming from" in err and "checkpoint-2" in err
    assert "learning_rate: 0.001" in (run / "resolved_recipe.yaml").read_text()
    assert (run / "final" / "model.safetensors").is_file()

    # Another recipe (SFT of the same model) cannot continue this run, --force or not.
    for extra in ((), ("--force",)):
        code, err = _train(tmp_path, capsys, "sft-full", *extra)
        assert code == 2 and "Traceback" not in err
        assert "holds a run of another recipe (stage differs)" in err and "stage: pretrain -> sft" in err
        assert "hint: pass --overwrite to delete that run and start over" in err
    code, err = _train(tmp_path, capsys, "sft-full", "--overwrite")
    assert code == 0, err
    assert "stage: sft" in (run / "resolved_recipe.yaml").read_text()
