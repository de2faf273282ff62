"""QLoRA on a sharded base (DeepSpeed ZeRO-3, FSDP2): what the backends accept, and what the memory
model counts for it (non-quantized weights kept in the storage dtype; a 4-bit base loaded shard by
shard, or whole onto every GPU before it is sharded where tensor parallel loads it)."""

from __future__ import annotations

import pytest

from recipeforge.capabilities import capabilities_of, refusals
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import estimate, quantized_bytes_per_param, quantized_model_bytes
from plan_testing import bound_layout


@pytest.mark.parametrize("backend, zero", [("deepspeed", 3), ("fsdp", None)])
def test_4bit_qlora_runs_on_a_sharded_base(backend, zero):
    for offload in ("none", "optimizer+params"):
        assert refusals(capabilities_of(backend), stage="sft", device="cuda", adapter="qlora", quant_bits=4,
                        zero_stage=zero, offload=offload) == []


@pytest.mark.parametrize("backend, zero, key", [("deepspeed", 3, "adapter.quant.bits"),
                                                ("fsdp", None, "adapter.quant.bits")])
def test_8bit_bases_do_not_shard(backend, zero, key):
    found = refusals(capabilities_of(backend), stage="sft", device="cuda", adapter="qlora", quant_bits=8, zero_stage=zero)
    assert found and found[0].key == key and "8-bit" in found[0].message and "int8" in found[0].message
    assert "quant.bits: 4" in found[0].hint
    # 8-bit stays fine where the weights are kept whole
    assert refusals(capabilities_of("deepspeed"), adapter="qlora", quant_bits=8, zero_stage=2) == []


def _workload(name="meta-llama/Llama-2-70b-hf", gpus=2):
    from recipeforge.config.schema import recipe_adapter
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.hardware import hardware_for
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.workload import build_workload

    recipe = recipe_adapter().validate_python({
        "name": "q", "stage": "sft", "model": {"name_or_path": name, "dtype": "bf16"},
        "adapter": {"type": "qlora", "r": 8, "target_modules": "all-linear"},
        "data": {"datasets": [{"path": "d.jsonl", "format": "alpaca"}], "sequence_len": 2048, "packing": True},
        "train": {"global_batch_size": 8, "micro_batch_size": 2, "gradient_checkpointing": True},
        "hardware": {"nodes": 1, "gpus_per_node": gpus, "gpu": "A100-80GB"}})
    hw = hardware_for(recipe, None)
    return build_workload(recipe, resolve_model(name)[0], hw, Planners.installed())


def test_sharded_base_keeps_non_quantized_weights_in_the_storage_dtype():
    w = _workload()
    m = w.model
    z3 = estimate(w, bound_layout("deepspeed", "zero3", data_parallel=2, zero_stage=3, gpus_per_node=2), 2, True,
                  gpu_memory=80 * GIB)
    z2 = estimate(w, bound_layout("deepspeed", "zero2", data_parallel=2, zero_stage=2, gpus_per_node=2), 2, True,
                  gpu_memory=80 * GIB)
    q = m.linear_params() * quantized_bytes_per_param(4, True, m.hidden_size)
    others = m.total_params() - m.linear_params()
    assert z3.components["weights"] == pytest.approx((q + 2 * others) / 2)  # bf16, partitioned over 2
    assert z2.components["weights"] == pytest.approx(q + 4 * others)        # peft's fp32 upcast, whole


def test_a_base_loaded_whole_is_the_peak_while_it_loads():
    """With tensor parallel the quantized checkpoint loads whole onto every GPU before it is sharded."""
    w = _workload()
    mem = estimate(w, bound_layout("fsdp", "fsdp_full_shard", data_parallel=1, tensor_parallel=2, gpus_per_node=2), 2, True,
                   gpu_memory=80 * GIB)
    load = mem.components["quantized_load"]
    assert load == pytest.approx(quantized_model_bytes(w, 2))
    assert 33 * GIB < load < 35 * GIB                       # 69B weights at ~0.52 bytes, embeddings in bf16
    assert mem.total == pytest.approx(mem.components["runtime"] + load)  # the peak of this run
    assert any("loading the quantized model whole" in n for n in mem.notes)
    whole = estimate(w, bound_layout("deepspeed", "zero2", data_parallel=2, zero_stage=2, gpus_per_node=2), 2, True,
                     gpu_memory=80 * GIB)
    assert whole.components["quantized_load"] == 0.0  # unsharded: the loaded model is the trained one


@pytest.mark.parametrize("layout", [bound_layout("fsdp", "fsdp_full_shard", data_parallel=2, gpus_per_node=2),
                                    bound_layout("deepspeed", "zero3", data_parallel=2, zero_stage=3, gpus_per_node=2)],
                         ids=["fsdp2", "zero3"])
def test_the_4bit_base_loads_shard_by_shard(layout):
    """`backends.sharded_loading`: each GPU holds its shard (the weights term) and one checkpoint
    tensor in flight, here an MLP matrix (28672 x 8192 in bf16 plus its 4-bit copy, 0.55 GiB: more
    than the 32000 x 8192 embedding); never the whole base."""
    w = _workload()
    mem = estimate(w, layout, 2, True, gpu_memory=80 * GIB)
    load = mem.components["quantized_load"]
    assert load == pytest.approx(28672 * 8192 * (2 + quantized_bytes_per_param(4, w.double_quant, 8192)))
    assert load < quantized_model_bytes(w, 2) / 50
    assert mem.components["weights"] == pytest.approx(quantized_model_bytes(w, 2) / 2, rel=0.01)  # the shard
    assert mem.total > mem.components["runtime"] + mem.components["weights"] + load  # training is the peak
    assert any("shard by shard" in n for n in mem.notes)
    assert not any("loading the quantized model whole" in n for n in mem.notes)


def test_70b_qlora_plans_on_two_24gb_gpus(tmp_path):
    """The FSDP + QLoRA recipe of Answer.AI: Llama-3.1-70B on 2xRTX4090-24GB."""
    from recipeforge.config import load_recipe
    from recipeforge.plan import make_plan

    path = tmp_path / "r.yaml"
    path.write_text("stage: sft\nmodel: {name_or_path: meta-llama/Llama-3.1-70B}\nadapter: {type: qlora}\n"
                    "data: {datasets: [{path: d.jsonl, format: alpaca}], sequence_len: 2048}\n"
                    "train: {global_batch_size: 16}\nhardware: {gpus_per_node: 2, gpu: RTX4090-24GB}\n")
    plan = make_plan(load_recipe(path).recipe)
    assert plan.backend == "fsdp" and plan.world_size == 2
    assert plan.memory_gb["quantized_load"] < 3  # one tensor in flight, not the 37 GB base
    assert plan.memory_gb["total"] < 24 * 0.9
