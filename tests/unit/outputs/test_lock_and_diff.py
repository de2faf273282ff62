"""The lock of a recipe, the lock check of `train` and recipe differences (the commands `resolve --lock`,
`diff` and `train` as a user types them, and a run directory's lock file: tests/commands/test_lock_and_diff.py)."""

from __future__ import annotations

import shutil
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


def test_the_lock_holds_no_credentials(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.replace("sft-alpaca.jsonl", "https://user:hunter2@data.example/d.jsonl"))
    lock = build_lock(load_recipe(recipe), cpu_hardware())
    assert "hunter2" not in yaml.safe_dump(lock)
    assert lock["datasets"][0]["fingerprint"].endswith("@main") and lock["datasets"][0]["source"] == "requested"
