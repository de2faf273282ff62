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


def _plan_8b(backend: str, **hardware):
    distributed = {"backend": backend, **({"zero_stage": 3} if backend == "deepspeed" else {})}
    recipe = build_recipe(LLAMA_8B, model={"dtype": "bf16"}, train={"global_batch_size": 64}, distributed=distributed,
                          hardware={"gpus_per_node": 8, "gpu": "H100-80GB", **hardware})
    return make_plan(recipe)


def test_fsdp_full_fine_tune_streams_its_save_tensor_by_tensor():
    ph = _phases(_plan_8b("fsdp"))
    base = PROCESS_HOST_BYTES / GIB
    # every process: itself; rank 0 besides: one tensor in flight, the largest being the bf16 embeddings
    largest = 2 * 128256 * 4096 / GIB
    assert ph["save"]["host_per_process_gb"] == pytest.approx(base + largest, rel=0.01)
    assert ph["save"]["host_per_node_gb"] == pytest.approx(8 * base + largest, rel=0.01)
    assert ph["save"]["note"].startswith("streamed: final/ written tensor by tensor")
    # FSDP's rank 0 reads the whole model at load and broadcasts it
    assert ph["load"]["host_per_process_gb"] == pytest.approx(base + 2 * PSI_8B / GIB, rel=0.01)
    assert ph["train"]["gpu_per_process_gb"] == _plan_8b("fsdp").memory_gb["total"]
    for p in ph.values():
        assert p["gpu_per_node_gb"] == pytest.approx(8 * p["gpu_per_process_gb"], abs=0.05)


def test_zero3_full_fine_tune_streams_its_save_too():
    ph = _phases(_plan_8b("deepspeed"))
    largest = 2 * 128256 * 4096 / GIB
    assert ph["save"]["host_per_process_gb"] == pytest.approx(PROCESS_HOST_BYTES / GIB + largest, rel=0.01)
    assert ph["save"]["note"].startswith("streamed:")


def _plan_moe(**output):
    # Qwen3-30B-A3B: fused experts, written back one tensor per expert, so final/ is gathered on rank 0
    return make_plan(build_recipe("Qwen/Qwen3-30B-A3B", model={"dtype": "bf16"}, train={"global_batch_size": 64},
                                  distributed={"backend": "fsdp"}, output=output,
                                  hardware={"gpus_per_node": 8, "gpu": "H100-80GB", "cpu_ram_gb": 96}))


def test_an_moe_full_fine_tune_gathers_on_rank_0_to_save():
    ph = _phases(_plan_moe(max_shard_size="5GB"))
    psi = ph["save"]["host_per_process_gb"] - PROCESS_HOST_BYTES / GIB - 5e9 / GIB  # the gathered bf16 model
    assert psi * GIB / 2 == pytest.approx(30.5e9, rel=0.02)
    assert ph["save"]["note"].startswith("gathered: the full state dict gathered into rank 0's host RAM")

def test_one_process_serialises_one_file_of_output_max_shard_size_at_a_time():
    def save(**output):
        plan = make_plan(build_recipe("Qwen/Qwen2.5-1.5B", model={"dtype": "bf16"}, train={"global_batch_size": 8},
                                      output=output), parse_hardware("1xH100-80GB"))
        return _phases(plan)["save"]

    whole, files = save(), save(max_shard_size="1GB")
    assert whole["note"].startswith("serialised:") and "output.max_shard_size 50GB" in whole["note"]
    params = 1.54e9  # tied embeddings written once
    assert whole["host_per_process_gb"] == pytest.approx(PROCESS_HOST_BYTES / GIB + 2 * params / GIB, rel=0.02)
    assert files["host_per_process_gb"] == pytest.approx((PROCESS_HOST_BYTES + 1e9) / GIB, abs=0.01)

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
    # The MoE model's 57 GB gathered on rank 0 and one 50 GB file serialised beside it: over 86 GB usable
    with pytest.raises(RecipeError) as exc:
        _plan_moe()
    problem = exc.value.problems[0]
    assert problem.key == "hardware.cpu_ram_gb"
    assert "the save phase needs" in problem.message and "rank 0" in problem.message
    assert "output.max_shard_size" in (problem.hint or "") and "adapter.type: lora" in (problem.hint or "")
    assert "not available" not in (problem.hint or "")
    # the fix named: files of 5 GB make the same save fit
    assert _phases(_plan_moe(max_shard_size="5GB"))["save"]["host_per_node_gb"] < 0.9 * 96


@pytest.mark.parametrize("backend", ["fsdp", "deepspeed"])
def test_a_save_that_was_refused_plans_once_streamed(backend):
    # Llama-3.1-8B full fine-tune on 8 GPUs of a 32 GB node: gathering its 16 GB on rank 0 (and
    # serialising it) was refused; written tensor by tensor the save fits and the plan stands
    ph = _phases(_plan_8b(backend, cpu_ram_gb=32))
    assert ph["save"]["note"].startswith("streamed:")
    assert ph["save"]["host_per_node_gb"] < 8 * PROCESS_HOST_BYTES / GIB + 1.5 < 0.9 * 32

def test_a_single_process_save_names_output_max_shard_size():
    def plan(**output):
        return make_plan(build_recipe("Qwen/Qwen2.5-1.5B", model={"dtype": "bf16"}, train={"global_batch_size": 8},
                                      output=output, hardware={"gpus_per_node": 1, "gpu": "H100-80GB",
                                                               "cpu_ram_gb": 4}))

    with pytest.raises(RecipeError) as exc:
        plan()  # the process (1.5 GB) and one 3 GB file above the 3.6 GB usable
    problem = exc.value.problems[0]
    assert "the save phase needs" in problem.message and "output.max_shard_size" in (problem.hint or "")
    assert _phases(plan(max_shard_size="1GB"))["save"]["host_per_process_gb"] < 0.9 * 4
