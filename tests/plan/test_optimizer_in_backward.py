"""`train.optimizer_in_backward` in the planner: torchtune's full fine-tune of Llama-3.1-8B on one
RTX 4090 (bf16 weights and states, paged 8-bit AdamW stepped in the backward pass: 18.9 GiB peak,
torchtune README "Memory and training speed", config llama3_1/8B_full_single_device, batch 2 packed
to 2048 tokens, activation checkpointing, chunked cross-entropy) plans a fit; the same recipe without
the step in backward is refused as before; layouts that cannot step in backward are refused at the key."""

from __future__ import annotations

import pytest

from plan_testing import build_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, parse_hardware
from recipeforge.plan.memory import measured_view
from recipeforge.plan.plan import make_plan

LLAMA_8B = "meta-llama/Llama-3.1-8B"
RTX4090 = parse_hardware("1xRTX4090-24GB")
TORCHTUNE_GIB = 18.9  # allocator peak (max_memory_allocated)
BAND = 0.17           # the planner's stated accuracy band for this layout (`plan.accuracy`)


def _recipe(**train):
    return build_recipe(LLAMA_8B, model={"dtype": "bf16"}, data={"sequence_len": 2048, "packing": True},
                        train={"global_batch_size": 2, "micro_batch_size": 2, "gradient_checkpointing": True,
                               "optimizer": "paged_adamw_8bit", "precision": "pure_bf16", **train},
                        kernels={"liger": {"fused_linear_cross_entropy": True, "rms_norm": False,
                                           "swiglu": False, "rope": False}},
                        distributed={"backend": "single"})


def test_full_8b_on_one_4090_fits_with_the_step_in_backward():
    plan = make_plan(_recipe(optimizer_in_backward=True, max_grad_norm=None), RTX4090)
    assert plan.backend == "single" and plan.gradient_accumulation == 1
    allocated = measured_view(plan.memory_gb, "allocated")
    assert abs(allocated - TORCHTUNE_GIB) <= BAND * TORCHTUNE_GIB, plan.memory_gb
    assert plan.memory_gb["total"] <= 0.9 * 24
    # one parameter's gradient and paged states at a time, not the model's
    assert plan.memory_gb["in_backward_step"] < 2.5 and "gradients" not in plan.memory_gb
    assert "paged_optimizer" not in plan.memory_gb and "optimizer" not in plan.memory_gb
    assert any("optimizer step in the backward pass" in w for w in plan.extra.warnings)


def test_the_same_recipe_without_it_is_refused():
    with pytest.raises(RecipeError, match=r"does not fit on 1xRTX4090-24GB.*needs 45\.7 GB"):
        make_plan(_recipe(), RTX4090)


def test_auto_micro_batch_takes_the_whole_step():
    recipe = build_recipe("tiny:llama", train={"global_batch_size": 16, "optimizer_in_backward": True,
                                               "max_grad_norm": None})
    plan = make_plan(recipe, parse_hardware("1xA100-80GB"))
    assert plan.micro_batch_size == 16 and plan.gradient_accumulation == 1


def test_auto_on_several_gpus_is_refused_at_the_key_and_single_plans_one():
    recipe = build_recipe(LLAMA_8B, train={"global_batch_size": 8, "optimizer_in_backward": True,
                                           "max_grad_norm": None})
    with pytest.raises(RecipeError) as exc:
        make_plan(recipe, parse_hardware("8xH100-80GB"))
    assert exc.value.problems[0].key == "train.optimizer_in_backward"
    assert "distributed.backend: single" in (exc.value.problems[0].hint or "")
    pinned = build_recipe(LLAMA_8B, train={"global_batch_size": 8, "optimizer_in_backward": True,
                                           "max_grad_norm": None}, distributed={"backend": "single"})
    plan = make_plan(pinned, parse_hardware("8xH100-80GB"))
    assert plan.backend == "single" and plan.data_parallel == 1 and plan.gradient_accumulation == 1


def test_data_parallel_and_sharded_layouts_are_refused_at_the_key():
    from plan_testing import bound_layout
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.optim_in_backward import in_backward_refusals
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.workload import build_workload

    hw = parse_hardware("2xH100-80GB")
    w = build_workload(build_recipe(LLAMA_8B, train={"optimizer_in_backward": True, "max_grad_norm": None}),
                       resolve_model(LLAMA_8B)[0], hw, Planners.installed())
    for layout in (bound_layout("ddp", data_parallel=2, gpus_per_node=2),
                   bound_layout("fsdp", "fsdp_full_shard", data_parallel=2, gpus_per_node=2),
                   bound_layout("deepspeed", "zero2", data_parallel=2, zero_stage=2, gpus_per_node=2)):
        found = in_backward_refusals(w, layout)
        assert found and found[0].key == "train.optimizer_in_backward", layout
    assert in_backward_refusals(w, bound_layout("single", gpus_per_node=1)) == []


def test_the_gradients_shrink_to_the_largest_parameter():
    off = make_plan(_recipe(optimizer="adamw"), parse_hardware("1xH200-141GB"))
    on = make_plan(_recipe(optimizer="adamw", optimizer_in_backward=True, max_grad_norm=None),
                   parse_hardware("1xH200-141GB"))
    embedding = 128256 * 4096 * 2 / GIB  # bf16 gradient of the largest parameter
    assert on.memory_gb["in_backward_step"] == pytest.approx(2 * embedding, rel=0.02)  # + foreach temporary
    assert on.memory_gb["total"] < off.memory_gb["total"] - 10
