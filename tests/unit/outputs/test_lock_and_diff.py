"""`recipeforge resolve --lock`, the lock check of `train`, the run directory's lock file and `recipeforge diff`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.config.lock import build_lock, check_lock, hub_commit, lock_differences, model_lock, plan_hardware
from recipeforge.errors import RecipeError
from recipeforge.outputs.run_guard import recipe_diff, recipe_hash

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "examples" / "data"
RECIPE = """\
stage: sft
model: {name_or_path: tiny:llama}
data:
  datasets:
    - {path: sft-alpaca.jsonl, format: alpaca}
train: {max_steps: 2, learning_rate: 1.0e-3}
"""
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def recipe(tmp_path) -> Path:
    shutil.copy(DATA / "sft-alpaca.jsonl", tmp_path / "sft-alpaca.jsonl")
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE + f"output: {{dir: {tmp_path / 'run'}}}\n")
    return path


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def cpu_hardware() -> dict:
    return {"nodes": 1, "gpus_per_node": 0, "gpu": "cpu", "backend": "single", "world_size": 1}


def test_the_lock_pins_packages_model_data_and_hardware(recipe):
    from recipeforge.components.fingerprint import file_digest
    from recipeforge.plan.world import plan_for_world

    loaded = load_recipe(recipe)
    lock = build_lock(loaded, plan_hardware(plan_for_world(loaded.recipe)))
    assert lock["packages"]["transformers"] == metadata.version("transformers")
    assert set(lock["packages"]) == {"torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets",
                                     "recipeforge"}
    assert lock["model"]["source"] == "tiny" and lock["model"]["revision"].startswith("spec:")
    assert lock["datasets"] == [{"key": "data.datasets[0]", "path": "sft-alpaca.jsonl", "source": "local",
                                 "fingerprint": "sha256:" + file_digest(recipe.parent / "sft-alpaca.jsonl")}]
    assert lock["hardware"] == cpu_hardware()
    assert lock_differences(lock, lock) == []
    (recipe.parent / "sft-alpaca.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    changed = build_lock(loaded, cpu_hardware())
    assert lock_differences(lock, changed) == [
        f"dataset data.datasets[0]: {changed['datasets'][0]['fingerprint']} here, "
        f"{lock['datasets'][0]['fingerprint']} locked"]
    older = {**lock, "packages": {**lock["packages"], "trl": "0.1.0"}, "hardware": {**cpu_hardware(), "gpu": "H100-80GB"}}
    assert lock_differences(older, changed)[:1] == [f"package trl: {metadata.version('trl')} here, 0.1.0 locked"]
    assert "hardware gpu: cpu here, H100-80GB locked" in lock_differences(older, changed)


def test_hub_revision_comes_from_the_local_cache_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    refs = tmp_path / "hub" / "models--my-org--my-model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(COMMIT)
    assert hub_commit("my-org/my-model", None) == COMMIT
    assert hub_commit("my-org/my-model", "v2") is None
    assert hub_commit("my-org/other", COMMIT) == COMMIT  # a commit is its own resolution
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("tiny:llama", "my-org/my-model"))
    assert model_lock(load_recipe(recipe)) == {"name_or_path": "my-org/my-model", "revision": COMMIT,
                                               "source": "hub-cache", "note": None}
    recipe.write_text(RECIPE.replace("tiny:llama", "my-org/missing"))
    locked = model_lock(load_recipe(recipe))
    assert (locked["revision"], locked["source"]) == ("main", "requested") and "not in the local" in locked["note"]


def test_a_local_model_directory_is_pinned_by_its_content(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("tiny:llama", "model"))
    first = model_lock(load_recipe(recipe))
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    second = model_lock(load_recipe(recipe))
    assert first["source"] == "local" and first["revision"].startswith("sha256:") and first != second


def test_check_lock_warns_or_refuses(recipe):
    loaded = load_recipe(recipe)
    lock = build_lock(loaded, cpu_hardware())
    lock["packages"]["peft"] = "0.0.1"
    locked_path = recipe.with_name("locked.yaml")
    locked_path.write_text(recipe.read_text() + yaml.safe_dump({"lock": lock}))
    locked = load_recipe(locked_path)
    warned = []
    assert check_lock(locked, cpu_hardware(), strict=False, warn=warned.append) == [
        f"package peft: {metadata.version('peft')} here, 0.0.1 locked"]
    assert warned and warned[0].startswith("warning: differs from the lock: package peft")
    with pytest.raises(RecipeError, match="package peft") as err:
        check_lock(locked, cpu_hardware(), strict=True, warn=warned.append)
    assert err.value.problems[0].key == "lock"
    assert check_lock(loaded, cpu_hardware(), strict=True, warn=warned.append) == []  # no lock: nothing to check


def test_a_lock_is_no_recipe_change(recipe):
    from recipeforge.config.dump import resolved_data

    data = resolved_data(load_recipe(recipe))
    assert "lock" not in data  # an unlocked recipe reads as before
    locked = {**data, "lock": build_lock(load_recipe(recipe), cpu_hardware())}
    assert recipe_hash(locked) == recipe_hash(data) and recipe_diff(data, locked) == []


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


def test_the_lock_holds_no_credentials(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("sft-alpaca.jsonl", "https://user:hunter2@data.example/d.jsonl"))
    lock = build_lock(load_recipe(recipe), cpu_hardware())
    assert "hunter2" not in yaml.safe_dump(lock)
    assert lock["datasets"][0]["fingerprint"].endswith("@main") and lock["datasets"][0]["source"] == "requested"


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
