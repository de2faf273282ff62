"""Model-state memory against the ZeRO paper and DeepSpeed's published estimator outputs (against
the installed DeepSpeed: tests/commands/test_plan_estimators.py)."""

from __future__ import annotations


import pytest

from recipeforge.plan.estimators import deepspeed_zero2_mem_needs, deepspeed_zero3_mem_needs, zero_model_states
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import estimate
from recipeforge.plan.models import ModelSpec
from recipeforge.plan.workload import Workload
from plan_testing import bound_layout

GB = 1e9  # the ZeRO paper counts in 10^9 bytes


@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, expected_gb):
    # Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, N_d = 64, K = 12 (mixed-precision Adam)
    per_gpu = sum(zero_model_states(7.5e9, 64, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12))
    assert per_gpu / GB == pytest.approx(expected_gb, rel=0.02)


def test_zero_stage_validation():
    with pytest.raises(ValueError):
        zero_model_states(1e9, 8, 4)


# DeepSpeed "Memory Requirements" page: t5-3b cold estimates, 1 node x 8 GPUs
# (total_params=2851e6, largest_layer_params=32e6). (cpu GiB, gpu GiB) per row.
ZERO3_PUBLISHED = [
    ((True, True, True), 71.69, 0.12),
    ((True, True, False), 127.45, 0.12),
    ((True, False, True), 63.72, 0.78),
    ((True, False, False), 127.45, 0.78),
    ((False, False, True), 1.43, 6.09),
    ((False, False, False), 127.45, 6.09),
]


@pytest.mark.parametrize("options, cpu_gb, gpu_gb", ZERO3_PUBLISHED)
def test_deepspeed_zero3_published(options, cpu_gb, gpu_gb):
    offload_optimizer, offload_params, zero_init = options
    cpu, gpu, _ = deepspeed_zero3_mem_needs(2851e6, 32e6, 8, 1, offload_optimizer, offload_params, zero_init)
    assert round(cpu / GIB, 2) == cpu_gb
    assert round(gpu / GIB, 2) == gpu_gb


def test_deepspeed_zero2_published_offload_row():
    cpu, gpu = deepspeed_zero2_mem_needs(2851e6, 8, 1, offload_optimizer=True)
    assert (round(cpu / GIB, 2), round(gpu / GIB, 2)) == (127.45, 5.31)


def test_published_zero2_row_is_stage_1_accounting():
    # The page's ZeRO-2 no-offload row (15.93 GB) counts the 16-bit gradients whole: 4*P + 16*P/N.
    # That is ZeRO-1's layout with K = 16 (fp32 master weights, gradients, momentum, variance).
    per_gpu = sum(zero_model_states(2851e6, 8, 1, weight_bytes=2, grad_bytes=2, optimizer_bytes=16))
    assert round(per_gpu / GIB, 2) == 15.93
    # DeepSpeed's current estimator partitions them too: 2*P + 18*P/N
    _, gpu = deepspeed_zero2_mem_needs(2851e6, 8, 1, offload_optimizer=False)
    assert gpu == 2 * 2851e6 + int(18 * 2851e6 / 8)
    assert gpu == pytest.approx(sum(zero_model_states(2851e6, 8, 2, weight_bytes=2, grad_bytes=2,
                                                      optimizer_bytes=16)), abs=1)


def test_t5_large_worked_example():
    # Same page: t5-large (737.67M params, largest layer 32.90M) on 4 GPUs: cases 1-3 in MiB
    for offload_optimizer, offload_params, mib in ((False, False, 3291), (True, True, 125), (True, False, 477)):
        _, gpu, _ = deepspeed_zero3_mem_needs(737.67e6, 32.90e6, 4, 1, offload_optimizer, offload_params)
        assert gpu >> 20 == pytest.approx(mib, abs=1)


def _full_ft_workload(params: float) -> Workload:
    # one layer whose size makes total_params() == params: the model-state parts only depend on it
    spec = ModelSpec(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                     num_layers=1, num_heads=32, num_kv_heads=32, head_dim=128, tie_embeddings=False)
    scale = params / spec.total_params()
    spec = ModelSpec(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                     num_layers=max(1, round(scale)), num_heads=32, num_kv_heads=32, head_dim=128,
                     tie_embeddings=False)
    return Workload(model=spec, stage="sft", dtype="bf16", adapter="none", optimizer="adamw",
                    attention="fused", seq_len=1, logit_tokens=1)


@pytest.mark.parametrize("gpus, nodes", [(8, 1), (8, 4), (4, 2)])
@pytest.mark.parametrize("preset, stage, offload", [
    ("zero2", 2, "none"), ("zero2_offload", 2, "optimizer"),
    ("zero3", 3, "none"), ("zero3_offload", 3, "optimizer"), ("zero3_offload_params", 3, "optimizer+params"),
])
def test_planner_deepspeed_states_equal_deepspeed_estimators(gpus, nodes, preset, stage, offload):
    w = _full_ft_workload(7e9)
    psi, largest = w.model.total_params(), w.model.largest_module_params()
    layout = bound_layout("deepspeed", preset, data_parallel=gpus * nodes, zero_stage=stage, offload=offload,
                          nodes=nodes, gpus_per_node=gpus)
    mem = estimate(w, layout, micro_batch=1, checkpointing=True)
    states = sum(mem.components[k] for k in ("weights", "gradients", "optimizer"))
    if stage == 3:
        cpu, gpu, layer = deepspeed_zero3_mem_needs(psi, largest, gpus, nodes, offload != "none",
                                                    offload == "optimizer+params")
        states += 4 * largest  # the estimator includes the gathered largest layer
        if offload != "none":  # host memory is only checked for offloaded states
            assert mem.cpu_per_node == pytest.approx(cpu, rel=1e-9)
    else:
        _, gpu = deepspeed_zero2_mem_needs(psi, gpus, nodes, offload != "none")
    assert states == pytest.approx(gpu, rel=1e-6)
