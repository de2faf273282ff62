"""The planner's per-phase peaks (`plan.phases`): what each phase adds to the persistent terms, per
process and per node, on the GPU and the host; the largest host phase is checked against the node's RAM."""

from __future__ import annotations

import pytest

from plan_testing import build_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB, parse_hardware
from recipeforge.plan.phases import PROCESS_HOST_BYTES, SHARD_BYTES
from recipeforge.plan.plan import make_plan

LLAMA_8B = "meta-llama/Llama-3.1-8B"
PSI_8B = 8.03e9


def _phases(plan):
    return {p["phase"]: p for p in plan.extra.phases}


def test_fsdp_full_fine_tune_gathers_on_rank_0_to_save():
    plan = make_plan(build_recipe(LLAMA_8B, model={"dtype": "bf16"}, train={"global_batch_size": 64},
                                  distributed={"backend": "fsdp"}), parse_hardware("8xH100-80GB"))
    ph = _phases(plan)
    base = PROCESS_HOST_BYTES / GIB
    # every process: itself; rank 0 besides: the gathered bf16 state dict and one serialised 50 GB file
    extra = (2 * PSI_8B + min(2 * PSI_8B, SHARD_BYTES)) / GIB
    assert ph["save"]["host_per_process_gb"] == pytest.approx(base + extra, rel=0.01)
    assert ph["save"]["host_per_node_gb"] == pytest.approx(8 * base + extra, rel=0.01)
    # FSDP's rank 0 reads the whole model at load and broadcasts it
    assert ph["load"]["host_per_process_gb"] == pytest.approx(base + 2 * PSI_8B / GIB, rel=0.01)
    assert ph["train"]["gpu_per_process_gb"] == plan.memory_gb["total"]
    for p in ph.values():
        assert p["gpu_per_node_gb"] == pytest.approx(8 * p["gpu_per_process_gb"], abs=0.05)


def test_a_lora_run_saves_the_adapter_and_merges_the_base_on_the_host():
    plan = make_plan(build_recipe(LLAMA_8B, model={"dtype": "bf16"}, adapter={"type": "lora", "r": 16},
                                  output={"merge_adapter": True}, train={"global_batch_size": 8}),
                     parse_hardware("1xH100-80GB"))
    ph = _phases(plan)
    assert list(ph) == ["load", "train", "eval", "save", "merge"] or list(ph) == ["load", "train", "save", "merge"]
    assert ph["save"]["host_per_process_gb"] < PROCESS_HOST_BYTES / GIB + 1  # the adapter alone
    merge = ph["merge"]["host_per_process_gb"] - PROCESS_HOST_BYTES / GIB
    assert merge == pytest.approx(2 * 2 * PSI_8B / GIB, rel=0.01)  # base loaded in bf16 + serialised


def test_on_the_cpu_the_step_is_host_memory():
    plan = make_plan(build_recipe("tiny:llama", train={"global_batch_size": 8}, hardware={"gpus_per_node": 0}))
    ph = _phases(plan)
    assert all(p["gpu_per_process_gb"] == 0 for p in ph.values())
    assert ph["train"]["host_per_process_gb"] == pytest.approx(plan.memory_gb["total"] + PROCESS_HOST_BYTES / GIB,
                                                               abs=0.01)


def test_the_largest_host_phase_must_fit_and_is_named():
    recipe = build_recipe(LLAMA_8B, model={"dtype": "bf16"}, train={"global_batch_size": 64},
                          distributed={"backend": "fsdp"},
                          hardware={"gpus_per_node": 8, "gpu": "H100-80GB", "cpu_ram_gb": 32})
    with pytest.raises(RecipeError) as exc:
        make_plan(recipe)
    problem = exc.value.problems[0]
    assert problem.key == "hardware.cpu_ram_gb"
    assert "the save phase needs" in problem.message and "rank 0" in problem.message
    assert "adapter.type: lora" in (problem.hint or "")
