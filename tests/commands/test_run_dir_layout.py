"""The run directory's descriptive files and environment record (which asks `git` for the checkout's commit;
the rest of the run directory: tests/unit/outputs/test_run_dir_layout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from recipeforge.config import load_recipe
from recipeforge.outputs.run_dir import RunDir, environment_info

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"


def test_descriptive_files(tmp_path):
    from recipeforge.plan import make_plan

    loaded = load_recipe(TINY / "pretrain.yaml")
    run = RunDir(tmp_path)
    run.write_recipe(loaded.tree.data, loaded.path)
    run.write_plan(make_plan(loaded.recipe))
    run.write_environment()
    assert yaml.safe_load(run.resolved_recipe.read_text())["stage"] == "pretrain"
    assert json.loads(run.plan.read_text())["backend"] == "single"
    env = json.loads(run.environment.read_text())
    assert env["packages"]["recipeforge"] and "python" in env and "git" in env
    assert sorted(p.name for p in tmp_path.iterdir()) == ["environment.json", "plan.json", "resolved_recipe.yaml"]


def test_environment_has_versions():
    info = environment_info()
    assert {"torch", "transformers", "trl", "peft", "datasets"} <= set(info["packages"])
