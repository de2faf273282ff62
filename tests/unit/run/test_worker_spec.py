"""The worker spec: written private, read back only if recipeforge wrote it for this user, every field
checked; and a worker's settings and recipe come from it, never from its ``RECIPEFORGE_*`` environment."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from recipeforge.backends.worker_spec import WorkerSpec
from recipeforge.errors import RecipeError
from recipeforge.settings import Settings, current, installed

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def _spec(tmp_path: Path, **changes: object) -> WorkerSpec:
    spec = WorkerSpec(plan=str(tmp_path / "plan.json"), run_dir=str(tmp_path), outcome=str(tmp_path / "outcome.json"),
                      recipe=str(RECIPE), overrides=("train.max_steps=3",),
                      recipe_env={"RECIPEFORGE_SEED": "7"}, settings=Settings(verbose=True, fault="nan:2"))
    return replace(spec, **changes)  # type: ignore[arg-type]


def test_written_private_and_read_back_whole(tmp_path):
    spec = _spec(tmp_path)
    spec.write(tmp_path / "worker.json")
    assert (tmp_path / "worker.json").stat().st_mode & 0o777 == 0o600
    assert WorkerSpec.read_trusted(tmp_path / "worker.json") == spec


@pytest.mark.parametrize("damage, said", [
    (lambda p: os.chmod(p, 0o644), "not private to this user"),
    (lambda p: os.chmod(p, 0o620), "not private to this user"),
    (lambda p: (p.rename(p.with_name("real.json")), p.symlink_to(p.with_name("real.json"))), "not a regular file"),
    (lambda p: p.unlink(), "cannot read the worker spec"),
])
def test_a_spec_recipeforge_did_not_write_for_this_user_is_refused(tmp_path, damage, said):
    path = tmp_path / "worker.json"
    _spec(tmp_path).write(path)
    damage(path)
    with pytest.raises(RecipeError) as err:
        WorkerSpec.read_trusted(path)
    assert said in err.value.render() and "recipeforge train" in err.value.render()


def test_only_a_file_named_worker_json_is_a_spec(tmp_path):
    _spec(tmp_path).write(tmp_path / "other.json")
    with pytest.raises(RecipeError, match="is not a worker spec"):
        WorkerSpec.read_trusted(tmp_path / "other.json")


@pytest.mark.parametrize("field, value, said", [
    ("version", 1, "another recipeforge version"),
    ("plan", "plan.json", "plan must be an absolute path"),
    ("outcome", 3, "outcome must be an absolute path"),
    ("overrides", "train.max_steps=3", "overrides must be a list"),
    ("recipe_env", {"HF_TOKEN": "x"}, "recipe_env must map RECIPEFORGE_"),
    ("settings", {"verbose": "yes"}, "settings must hold exactly"),
    ("extra", 1, "fields ['extra']"),
])
def test_every_field_is_checked(tmp_path, field, value, said):
    data = json.loads(_spec(tmp_path).to_json())
    data[field] = value
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    with pytest.raises(RecipeError, match=said.replace("[", r"\[").replace("]", r"\]")):
        WorkerSpec.read_trusted(path)


@pytest.mark.parametrize("name, value", [("trust_code", "1"), ("progress_interval", -1), ("debug", 1),
                                         ("cache_dir", 5), ("service_timeout", True)])
def test_a_setting_of_the_wrong_type_is_refused(tmp_path, name, value):
    data = json.loads(_spec(tmp_path).to_json())
    data["settings"][name] = value
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    with pytest.raises(RecipeError, match=f"settings.{name} has the wrong type"):
        WorkerSpec.read_trusted(path)


def test_installed_settings_answer_every_reader_whatever_the_environment(monkeypatch, tmp_path):
    from recipeforge.backends.data_ready import injected_delay
    from recipeforge.components.lm_data import default_cache_root
    from recipeforge.outputs.atomic import _fault_point
    from recipeforge.outputs.console import verbose
    from recipeforge.registry import code_trust

    for name, value in (("RECIPEFORGE_VERBOSE", "1"), ("RECIPEFORGE_TRUST_CODE", "1"), ("RECIPEFORGE_DEBUG", "1"),
                        ("RECIPEFORGE_FAULT", "slow_tokenize:4"), ("RECIPEFORGE_CACHE", str(tmp_path / "env-cache"))):
        monkeypatch.setenv(name, value)
    # Without a spec (a command a user typed): the environment.
    assert verbose() and code_trust(False)[0] and injected_delay() == 4.0
    assert default_cache_root() == tmp_path / "env-cache"
    spec_settings = Settings(cache_dir=str(tmp_path / "spec-cache"), fault="oom:3")
    with installed(spec_settings):  # a worker: the spec's, and nothing the environment says
        assert current() is spec_settings
        assert not verbose() and code_trust(False) == (False, "off: the recipe may name registered components only")
        assert injected_delay() == 0.0 and _fault_point() == ("oom", 3)
        assert default_cache_root() == tmp_path / "spec-cache"
    with installed(Settings(trust_code=True, trust_source="--trust-code")):
        monkeypatch.delenv("RECIPEFORGE_TRUST_CODE")
        assert code_trust(False) == (True, "--trust-code")
    assert current() == Settings.from_environment()


def test_a_worker_loads_its_recipe_with_the_spec_values_not_its_environment(monkeypatch, tmp_path):
    from recipeforge.run.spec import recipe_env
    from recipeforge.run.worker import load_spec_recipe

    monkeypatch.setenv("RECIPEFORGE_TRAIN__LEARNING_RATE", "0.5")
    monkeypatch.setenv("RECIPEFORGE_TRAIN__SEED", "11")
    monkeypatch.setenv("RECIPEFORGE_VERBOSE", "1")
    # What the launching command applied and carries: the recipe's sections only, not its settings.
    assert recipe_env() == {"RECIPEFORGE_TRAIN__LEARNING_RATE": "0.5", "RECIPEFORGE_TRAIN__SEED": "11"}
    spec = _spec(tmp_path, recipe_env={"RECIPEFORGE_TRAIN__LEARNING_RATE": "0.25"})
    loaded = load_spec_recipe(spec)
    assert loaded.recipe.train.learning_rate == 0.25 and loaded.recipe.train.max_steps == 3
    assert loaded.recipe.train.seed == 42  # the environment's own RECIPEFORGE_TRAIN__SEED is not read by a worker
