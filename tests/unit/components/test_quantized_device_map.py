"""Each process of a multi-GPU QLoRA job loads its 4-bit model onto its own GPU."""

from __future__ import annotations

from recipeforge.components.models import quantized_device_map


def test_rank_0_loads_onto_gpu_0():
    assert quantized_device_map("cuda", {"LOCAL_RANK": "0", "RANK": "0"}) == {"": 0}


def test_rank_1_loads_onto_its_own_gpu():
    # Second process of the node (and of a second node: the global rank does not matter).
    assert quantized_device_map("cuda", {"LOCAL_RANK": "1", "RANK": "1"}) == {"": 1}
    assert quantized_device_map("cuda", {"LOCAL_RANK": "1", "RANK": "9"}) == {"": 1}


def test_single_process_and_cpu():
    assert quantized_device_map("cuda", {}) == {"": 0}
    assert quantized_device_map("cpu", {"LOCAL_RANK": "1"}) == {"": "cpu"}
