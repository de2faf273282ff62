"""Methods that swap whole linear layers (`train.qat`, `train.precision: fp8`) steer the planner: `auto`
never plans a layout the run refuses at start-up (QAT: no sharded weights and no tensor parallelism;
FP8: no tensor parallelism), and a recipe that pins such a layout is refused at the method's key with
the fix, before any process starts."""

from __future__ import annotations

import pytest

from plan_testing import build_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.plan import make_plan

LLAMA_8B = "meta-llama/Llama-3.1-8B"
LLAMA_70B = "meta-llama/Llama-3.1-70B"
QAT = {"scheme": "int4_weight", "group_size": 32}


def _plan(hardware: str, model: str = LLAMA_8B, distributed: dict | None = None, **train):
    recipe = build_recipe(model, train={"global_batch_size": 64, **train}, data={"sequence_len": 2048},
                          distributed=distributed or {})
    return make_plan(recipe, parse_hardware(hardware))


def test_without_qat_the_8b_full_fine_tune_shards_its_weights():
    """The premise: the same recipe without QAT plans a sharded layout on 8 GPUs."""
    assert _plan("8xH100-80GB").traits.shards_weights


@pytest.mark.parametrize("hardware", ["8xH100-80GB", "2x8xA100-80GB", "4xH100-80GB"])
def test_auto_plans_qat_on_a_layout_that_keeps_weights_whole(hardware):
    plan = _plan(hardware, qat=QAT)
    assert not plan.traits.shards_weights, (plan.backend, plan.preset)
    assert plan.tensor_parallel == 1
    assert plan.reasons["qat"].value == "int4_weight"


@pytest.mark.parametrize("distributed", [{"backend": "fsdp"}, {"backend": "deepspeed", "zero_stage": 3},
                                         {"preset": "zero3"}])
def test_a_pinned_sharding_layout_is_refused_at_train_qat(distributed):
    with pytest.raises(RecipeError) as e:
        _plan("8xH100-80GB", distributed=distributed, qat=QAT)
    assert e.value.problems[0].key == "train.qat"
    assert "shards the weights" in str(e.value) and "ddp" in (e.value.problems[0].hint or "")


def test_fp8_auto_never_plans_tensor_parallelism():
    plan = _plan("2x8xH100-80GB", model=LLAMA_70B, precision="fp8")
    assert plan.tensor_parallel == 1 and plan.reasons["precision"].value == "fp8"


@pytest.mark.parametrize("train", [{"precision": "fp8"}, {"qat": QAT}])
def test_pinned_tensor_parallelism_is_refused_at_the_method_key(train):
    with pytest.raises(RecipeError) as e:
        _plan("2x8xH100-80GB", model=LLAMA_70B, distributed={"backend": "fsdp", "tensor_parallel": 2}, **train)
    key = "train.precision" if "precision" in train else "train.qat"
    assert e.value.problems[0].key == key and "tensor parallelism (2)" in str(e.value)
    assert "distributed.tensor_parallel: 1" in (e.value.problems[0].hint or "")
