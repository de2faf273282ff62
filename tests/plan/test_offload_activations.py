"""The planner's activation term under `train.activation_offloading` (TRL's OffloadActivations)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recipeforge.plan.activations import activation_bytes, layer_activation_parts
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import estimate
from recipeforge.plan.offload_activations import FORWARD_STASH, offloaded_activations
from plan_testing import bound_layout


def _workload(offloading=True, gpus=1, seq=8192):
    from recipeforge.config.schema import recipe_adapter
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.hardware import hardware_for
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.workload import build_workload

    name = "meta-llama/Llama-3.1-8B"
    recipe = recipe_adapter().validate_python({
        "name": "o", "stage": "sft", "model": {"name_or_path": name, "dtype": "bf16"},
        "adapter": {"type": "lora", "r": 16, "target_modules": "all-linear"},
        "data": {"datasets": [{"path": "d.jsonl", "format": "alpaca"}], "sequence_len": seq, "packing": True},
        "train": {"global_batch_size": 8, "micro_batch_size": 1, "activation_offloading": offloading},
        "hardware": {"nodes": 1, "gpus_per_node": gpus, **({"gpu": "H100-80GB"} if gpus else {})}})
    return build_workload(recipe, resolve_model(name)[0], hardware_for(recipe, None), Planners.installed())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_what_stays_on_the_gpu_and_what_moves_to_host(checkpointing):
    w = _workload()
    m, c, tokens = w.model, w.compute_bytes, 8192
    full = activation_bytes(w, tokens, layers=m.num_layers, checkpointing=checkpointing)
    on_gpu, host = offloaded_activations(w, tokens, layers=m.num_layers, checkpointing=checkpointing)
    assert on_gpu + host == pytest.approx(full)
    per_layer = sum(layer_activation_parts(w).values())
    outside = 4 * m.hidden_size + 2 * c * m.hidden_size
    if checkpointing:  # the recomputed layer in full and two layer inputs, the output head's input
        assert on_gpu == pytest.approx(tokens * (outside + per_layer + 2 * c * m.hidden_size))
    else:  # two layers in backward (more than the forward stash of five MLP-wide tensors)
        assert 2 * per_layer > FORWARD_STASH * c * m.mlp_width
        assert on_gpu == pytest.approx(tokens * (outside + 2 * per_layer))
    # recomputation already keeps only layer inputs: offloading moves those; without it, most of them
    assert on_gpu < (full if checkpointing else full / 4)


def test_estimate_moves_the_activations_to_pinned_host_memory():
    on, off = _workload(True), _workload(False)
    layout = bound_layout("single", None, gpus_per_node=1)
    a = estimate(on, layout, 1, False, gpu_memory=80 * GIB)
    b = estimate(off, layout, 1, False, gpu_memory=80 * GIB)
    moved = b.components["activations"] - a.components["activations"]
    assert moved > 10 * GIB                                    # 32 layers x 8192 tokens of an 8B model
    assert a.cpu_per_node - b.cpu_per_node == pytest.approx(moved)
    reserve = b.components["allocator_reserve"] - a.components["allocator_reserve"]
    assert a.total == pytest.approx(b.total - moved - reserve)  # and the idle blocks of their working tensors
    assert any("pinned host memory" in n for n in a.notes)
    assert a.components["logits"] == b.components["logits"]   # the loss still runs on the GPU
    # every GPU process of a node pins its own
    eight = estimate(replace(on), bound_layout("ddp", None, data_parallel=8, gpus_per_node=8), 1, False,
                     gpu_memory=80 * GIB)
    assert eight.cpu_per_node == pytest.approx(8 * a.cpu_per_node)


def test_cpu_runs_do_not_offload():
    assert _workload(True, gpus=0).activation_offloading is False
