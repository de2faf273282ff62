"""`recipeforge resolve --lock`, `diff` and the lock check of `train`, run as a user types them, and the lock
file of a run directory (whose environment record asks `git` for the checkout's commit; the lock itself:
tests/unit/outputs/test_lock_and_diff.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data"
RECIPE = """\
stage: sft
model: {name_or_path: tiny:llama}
data:
  datasets:
    - {path: sft-alpaca.jsonl, format: alpaca}
train: {max_steps: 2, learning_rate: 1.0e-3}
"""


@pytest.fixture
def recipe(tmp_path) -> Path:
    shutil.copy(DATA / "sft-alpaca.jsonl", tmp_path / "sft-alpaca.jsonl")
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE + f"output: {{dir: {tmp_path / 'run'}}}\n")
    return path


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_cli_resolve_lock_round_trip_and_diff(recipe, tmp_path):
    locked = tmp_path / "recipe.lock.yaml"
    done = run_cli("resolve", "--lock", str(recipe), "-o", str(locked))
    assert done.returncode == 0, done.stderr
    data = yaml.safe_load(locked.read_text())
    assert data["lock"]["packages"]["torch"] == metadata.version("torch")
    assert run_cli("validate", str(locked)).returncode == 0
    done = run_cli("diff", str(recipe), str(locked))
    assert done.returncode == 1 and "recipe: no differences" in done.stdout and "has a lock: section" in done.stdout
    assert run_cli("diff", str(recipe), str(recipe)).returncode == 0
    other = tmp_path / "other.yaml"
    other.write_text(recipe.read_text().replace("learning_rate: 1.0e-3", "learning_rate: 2.0e-3")
                     .replace("max_steps: 2,", "max_steps: 2, warmup_steps: 3,"))
    done = run_cli("diff", str(recipe), str(other))
    assert done.returncode == 1, done.stderr
    assert "  changed:\n    train.learning_rate: 0.001 -> 0.002\n    train.warmup_steps: null -> 3" in done.stdout
    tampered = tmp_path / "tampered.lock.yaml"
    tampered.write_text(locked.read_text().replace(f"trl: {metadata.version('trl')}", "trl: 0.1.0"))
    done = run_cli("diff", str(locked), str(tampered))
    assert done.returncode == 1 and f"packages.trl: {metadata.version('trl')} -> 0.1.0" in done.stdout
    assert "recipe: no differences" in done.stdout
    (tmp_path / "empty").mkdir()
    for bad in (str(tmp_path / "missing.yaml"), str(tmp_path / "empty")):
        done = run_cli("diff", str(recipe), bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("stage: sft\n")
    assert run_cli("diff", str(recipe), str(broken)).returncode == 2
    assert run_cli("diff", str(tmp_path), str(locked)).returncode == 0  # a directory with a lock file: a run dir


def test_cli_train_checks_the_lock(recipe, tmp_path):
    locked = tmp_path / "recipe.lock.yaml"
    assert run_cli("resolve", "--lock", str(recipe), "-o", str(locked)).returncode == 0
    tampered = tmp_path / "tampered.yaml"
    tampered.write_text(locked.read_text().replace(f"peft: {metadata.version('peft')}", "peft: 0.0.1"))
    done = run_cli("train", str(tampered), "--dry-run", "--strict")
    assert done.returncode == 2, done.stderr
    assert f"package peft: {metadata.version('peft')} here, 0.0.1 locked" in done.stderr
    done = run_cli("train", str(tampered), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "warning: differs from the lock: package peft" in done.stderr
    done = run_cli("train", str(locked), "--dry-run", "--strict")
    assert done.returncode == 0 and "differs from the lock" not in done.stderr


def test_every_run_directory_gets_its_lock_file(recipe):
    from recipeforge.outputs import run_lock
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.world import plan_for_world
    from recipeforge.run.run_directory import prepare_run as _prepare_run

    loaded = load_recipe(recipe)
    run = RunDir(recipe.parent / "run")
    try:
        _prepare_run(loaded, plan_for_world(loaded.recipe), run, overwrite=False)
    finally:
        run_lock.release_all()
    again = load_recipe(run.lock)  # the lock file is a recipe: it loads, lock section included
    assert again.recipe.lock.model.source == "tiny" and again.recipe.lock.hardware["backend"] == "single"
    assert again.recipe.train.learning_rate == 1e-3 and again.recipe.lock.datasets[0].source == "local"


def test_a_runs_lock_file_trains_into_that_run(recipe):
    from recipeforge.outputs import run_lock
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.world import plan_for_world
    from recipeforge.run.run_directory import prepare_run as _prepare_run

    loaded = load_recipe(recipe)
    run = RunDir(recipe.parent / "run")
    try:
        _prepare_run(loaded, plan_for_world(loaded.recipe), run, overwrite=False)
    finally:
        run_lock.release_all()
    from recipeforge.outputs.preflight import check_output_location

    check_output_location(run.root, recipe_path=run.lock)  # its folder is the run directory: not refused
    with pytest.raises(RecipeError, match="the recipe's folder"):
        check_output_location(run.root, recipe_path=run.root / "other.yaml")
    done = run_cli("train", str(run.lock), "--dry-run", "--strict")
    assert done.returncode == 0, done.stderr  # nothing differs from the lock
    assert run_cli("diff", str(run.root), str(run.lock)).returncode == 0
