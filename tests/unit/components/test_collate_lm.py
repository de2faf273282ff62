"""The causal-LM collator: padding, masks, and the padding share it reports."""

from __future__ import annotations

import pytest

from recipeforge.components.collate import IGNORE, LMCollator


def test_unpacked_rows_get_an_attention_mask():
    c = LMCollator(pad_token_id=0, packed=False)
    batch = c([{"input_ids": [5, 6, 7], "labels": [IGNORE, 6, 7]}, {"input_ids": [8], "labels": [8]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, 6, 7], [8, IGNORE, IGNORE]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert "position_ids" not in batch
    assert c.counter.take()["padding_share"] == pytest.approx(2 / 6)
    assert c.counter.take() == {}


def test_packed_rows_get_position_ids_and_padding_is_its_own_block():
    c = LMCollator(pad_token_id=0, packed=True, pad_to_multiple_of=4)
    batch = c([{"input_ids": [5, 6, 7], "labels": [IGNORE, 6, 7], "position_ids": [0, 0, 1]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 0]]
    assert batch["use_cache"] is False
    assert "attention_mask" not in batch
