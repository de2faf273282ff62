"""Presets, the plan of a launched world (CPU process counts, GPU narrowing) and the batch math."""

from __future__ import annotations

import pytest

from recipeforge.plan.presets import get_preset, known_preset_names
from recipeforge.plan.world import check_world, plan_for_world, processes_per_node
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware

TINY = "tiny/sft-full"


def test_every_preset_the_planner_offers_has_a_meaning(load):
    # Every preset the planner can choose or accept on a multi-node GPU target translates to settings.
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.candidates import known_presets
    from recipeforge.plan.workload import build_workload

    recipe = load("llama3-70b-full-sft").recipe
    hw = parse_hardware("2x8xH100-80GB")
    spec, _ = resolve_model(recipe.model.name_or_path, recipe.model.revision)
    names = known_presets(build_workload(recipe, spec, hw, Planners.installed()), hw, Planners.installed())
    assert {"zero2", "zero3_offload", "fsdp_full_shard", "fsdp_hybrid_shard", "tp8_pp1"} <= set(names)
    for name in names:
        preset = get_preset(name)
        assert preset.backend in ("deepspeed", "fsdp", "megatron")
        if preset.backend == "megatron":
            assert name.startswith(f"tp{preset.tensor_parallel}_pp{preset.pipeline_parallel}")


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(RecipeError) as err:
        get_preset("zero4", backend="deepspeed")
    problem = err.value.problems[0]
    assert problem.key == "distributed.preset" and "unknown preset 'zero4'" in problem.message
    assert "zero3" in problem.hint and all(n in problem.hint for n in known_preset_names("deepspeed"))
    with pytest.raises(RecipeError, match="for backend fsdp"):
        get_preset("zero2", backend="fsdp")
    assert get_preset("zero3_offload_params").offload == "optimizer+params"


def test_cpu_processes_split_the_global_batch(load):
    recipe = load(TINY, "train.micro_batch_size=auto", "train.global_batch_size=16").recipe
    assert make_plan(recipe).world_size == 1
    plan = plan_for_world(recipe, nproc_per_node=2)
    assert (plan.backend, plan.world_size, plan.data_parallel, plan.device) == ("ddp", 2, 2, "cpu")
    assert plan.micro_batch_size * plan.gradient_accumulation * plan.data_parallel == 16 == plan.global_batch_size
    assert processes_per_node(plan) == 2
    four = plan_for_world(recipe, nnodes=2, nproc_per_node=2)
    assert (four.world_size, four.nodes, processes_per_node(four)) == (4, 2, 2)
    assert four.micro_batch_size * four.gradient_accumulation * 4 == 16
    assert "2 node(s) x 2" in four.reasons["data_parallel"].reason


def test_deepspeed_pin_on_cpu_plans_zero(load):
    recipe = load(TINY, "train.micro_batch_size=auto", "distributed.backend=deepspeed",
                  "distributed.zero_stage=3").recipe
    plan = plan_for_world(recipe, nproc_per_node=2)
    assert (plan.backend, plan.preset, plan.backend_part.zero_stage, plan.offload) == ("deepspeed", "zero3", 3, "none")
    offload = plan_for_world(load(TINY, "train.micro_batch_size=auto", "distributed.backend=deepspeed",
                                  "distributed.preset=zero2_offload").recipe, nproc_per_node=2)
    assert (offload.backend_part.zero_stage, offload.offload, offload.preset) == (2, "optimizer", "zero2_offload")
    one = plan_for_world(recipe)  # one CPU process under DeepSpeed is still DeepSpeed
    assert (one.backend, one.world_size) == ("deepspeed", 1)


@pytest.mark.parametrize("overrides, nproc, fragment, key", [
    (("train.micro_batch_size=8",), 2, "not a multiple of micro batch 8 x 2", "train.micro_batch_size"),
    (("train.micro_batch_size=auto", "train.global_batch_size=9"), 2, "cannot be split over 2", "train.global_batch_size"),
    (("distributed.backend=single",), 2, "backend single runs one process", "distributed.backend"),
])
def test_cpu_world_mistakes_are_user_errors(load, overrides, nproc, fragment, key):
    with pytest.raises(RecipeError) as err:
        plan_for_world(load(TINY, *overrides).recipe, nproc_per_node=nproc)
    assert fragment in str(err.value) and err.value.problems[0].key == key


def test_gpu_target_is_narrowed_or_refused(load):
    recipe = load("llama3-70b-full-sft").recipe       # hardware: 2 x 8 x H100 in the recipe
    plan = plan_for_world(recipe)
    assert (plan.nodes, plan.gpus_per_node, plan.world_size) == (2, 8, 16)
    # --nnodes wins over the recipe's hardware.nodes, as every flag does: 4 nodes plan as 4 x 8 GPUs,
    # and one node is planned (and found too small) rather than refused as a contradiction.
    assert plan_for_world(recipe, nnodes=4).world_size == 32
    with pytest.raises(RecipeError, match="does not fit on 8xH100-80GB"):
        plan_for_world(recipe, nnodes=1)
    with pytest.raises(RecipeError, match="the target has 8 GPU"):
        plan_for_world(recipe, nproc_per_node=16)
    check_world(plan, 16)
    with pytest.raises(RecipeError, match="launcher started 8 processes but the plan is for 16"):
        check_world(plan, 8)
