"""Unpacked batches are padded to a multiple of 8 on GPUs (tensor-core friendly widths), not on the CPU."""

from __future__ import annotations

from recipeforge.components.collate import IGNORE, LMCollator, pad_multiple


def test_gpu_batches_are_padded_to_a_multiple_of_8():
    assert pad_multiple("cuda") == 8 and pad_multiple("cpu") is None
    rows = [{"input_ids": list(range(1, 12)), "labels": [IGNORE] + list(range(2, 12))},
            {"input_ids": [5, 6], "labels": [5, 6]}]
    gpu = LMCollator(pad_token_id=0, packed=False, pad_to_multiple_of=pad_multiple("cuda"))(rows)
    assert gpu["input_ids"].shape == (2, 16)
    assert gpu["attention_mask"].sum().item() == 13 and gpu["labels"][1, 2:].eq(IGNORE).all()
    cpu = LMCollator(pad_token_id=0, packed=False, pad_to_multiple_of=pad_multiple("cpu"))(rows)
    assert cpu["input_ids"].shape == (2, 11)
