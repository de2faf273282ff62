"""Environment and command-line overrides."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL


def test_cli_values_are_typed_by_yaml_rules(write):
    path = write("r.yaml", MINIMAL)
    r = load_recipe(path, ["train.learning_rate=1e-4", "train.gradient_checkpointing=true",
                           "adapter.target_modules=[q_proj, v_proj]", "data.datasets.0.path=other.jsonl"]).recipe
    assert r.train.learning_rate == 1e-4 and r.train.gradient_checkpointing is True
    assert r.adapter.target_modules == ("q_proj", "v_proj")
    assert r.data.datasets[0].path == "other.jsonl"


def test_list_items_take_the_key_form_errors_print(write):
    # errors name keys as data.datasets[0].path; a user copying that into an override gets the same item
    path = write("r.yaml", MINIMAL)
    r = load_recipe(path, ["data.datasets[0].path=other.jsonl", "data.datasets[0].max_samples=5"]).recipe
    assert (r.data.datasets[0].path, r.data.datasets[0].max_samples) == ("other.jsonl", 5)
    with pytest.raises(RecipeError, match="out of range"):
        load_recipe(path, ["data.datasets[3].path=x.jsonl"])


def test_cli_creates_sections_and_deletes_keys(write):
    path = write("r.yaml", MINIMAL + "adapter: {type: lora, r: 4}\n")
    loaded = load_recipe(path, ["logging.wandb.project=demo", "~adapter.r"])
    assert loaded.recipe.logging.wandb.project == "demo"
    assert loaded.recipe.adapter.r == 16  # back to the default
    assert loaded.tree.prov[("logging", "wandb", "project")].file == "<cli logging.wandb.project=demo>"


def test_env_overrides_come_before_cli(write):
    path = write("r.yaml", MINIMAL)
    env = {"RECIPEFORGE_TRAIN__SEED": "5", "RECIPEFORGE_TRAIN__LEARNING_RATE": "0.5",
           "RECIPEFORGE_CACHE_DIR": "/elsewhere"}  # not a recipe section: ignored
    r = load_recipe(path, ["train.seed=9"], environ=env).recipe
    assert r.train.seed == 9 and r.train.learning_rate == 0.5


def test_bad_override_errors_are_located(write):
    path = write("r.yaml", MINIMAL)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path, ["train.learning_rate", "~adapter.r", "data.datasets.5.path=x"])
    messages = [p.message for p in exc.value.problems]
    assert len(messages) == 3
    assert "is not key=value" in messages[0]
    assert "the recipe does not set it" in messages[1]
    assert "out of range" in messages[2]


def test_override_errors_in_validation_point_at_cli(write):
    path = write("r.yaml", MINIMAL)
    with pytest.raises(RecipeError) as exc:
        load_recipe(path, ["adapter.r=0"])
    p = exc.value.problems[0]
    assert p.key == "adapter.r" and p.location.file == "<cli adapter.r=0>"


def test_unicode_digits_in_an_override_key_are_a_user_error(write):
    """'²' is a digit to str.isdigit() but not a number to int(): a key (an unknown one), not a crash."""
    path = write("r.yaml", MINIMAL)
    for arg in ("²=", "data.datasets.².path=x", "train.¹=1"):
        with pytest.raises(RecipeError):
            load_recipe(path, [arg])
