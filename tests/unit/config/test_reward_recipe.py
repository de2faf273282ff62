"""`stage: reward`: the recipe, its `reward:` section, the data it takes and the backends that run it."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.schema.stage_recipes import STAGE_CLASSES, RewardRecipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL

REWARD = MINIMAL.replace("sft", "reward").replace("alpaca", "preference")


def problems(write, text, *overrides):
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", text), list(overrides))
    return {p.key: p for p in exc.value.problems}


def test_a_reward_recipe_loads_with_its_section_defaults(write):
    r = load_recipe(write("r.yaml", REWARD + "reward: {center_rewards_coefficient: 0.01}\n")).recipe
    assert isinstance(r, RewardRecipe) and STAGE_CLASSES["reward"] is RewardRecipe
    assert r.reward.center_rewards_coefficient == 0.01 and r.reward.disable_dropout is True
    assert load_recipe(write("d.yaml", REWARD)).recipe.reward.center_rewards_coefficient is None


def test_reward_section_errors_are_located(write):
    p = problems(write, REWARD + "reward:\n  center_rewards_coefficient: -1\n")["reward.center_rewards_coefficient"]
    assert p.message == "must be >= 0 (got -1)" and p.location.line == 8
    p = problems(write, REWARD + "reward:\n  center_reward_coefficient: 0.1\n")["reward.center_reward_coefficient"]
    assert p.hint == "did you mean 'center_rewards_coefficient'?"


def test_the_reward_section_belongs_to_the_reward_stage(write):
    ps = problems(write, MINIMAL + "reward: {center_rewards_coefficient: 0.01}\n")
    assert ps["reward"].hint == "the 'reward:' section applies only to stage: reward"


def test_reward_needs_preference_data(write):
    ps = problems(write, MINIMAL.replace("sft", "reward"))
    assert ps["data.datasets[0].format"].message == "stage 'reward' cannot train on format 'alpaca'"


@pytest.mark.parametrize("backend", ["single", "ddp", "deepspeed"])
def test_trainer_backends_run_it(write, backend):
    r = load_recipe(write("r.yaml", REWARD), [f"distributed.backend={backend}"]).recipe
    assert r.distributed.backend == backend


def test_megatron_refuses_it_with_the_reason(write):
    p = problems(write, REWARD + "hardware: {gpus_per_node: 8, gpu: H100-80GB}\n",
                 "distributed.backend=megatron")["distributed.backend"]
    assert "not reward" in p.message and "no preference or RL losses" in p.message
