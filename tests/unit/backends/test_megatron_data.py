"""The Megatron data files hold the HF path's rows: same token ids, same trained targets, row for row."""

from __future__ import annotations

import numpy as np
import pytest

from recipeforge.components.megatron_data import (PackedRow, hf_targets, megatron_targets, read_indexed_dataset,
                                                  read_packed_parquet, to_packed_row, write_indexed_dataset,
                                                  write_megatron_data)


def _hf_data(load, name, tmp_path, *overrides):
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import RecipeContext

    loaded = load(name, f"data.cache_dir={tmp_path / 'cache'}", *overrides)
    runner = runner_class(loaded.recipe.stage)(RecipeContext(loaded=loaded))
    runner.prepare()
    return runner.data, runner.tokenizer


@pytest.mark.parametrize("name,overrides", [("tiny/sft-full", ()), ("tiny/sft-lora", ()),
                                            ("tiny/sft-full", ("data.packing=false",)), ("tiny/pretrain", ())])
def test_rows_ids_and_masks_equal_the_hf_path(load, tmp_path, name, overrides):
    data, tok = _hf_data(load, name, tmp_path, *overrides)
    info = write_megatron_data(data, tmp_path / "mdata", vocab_size=len(tok), eos_id=tok.eos_token_id)
    for split, rows in (("training", data.train), ("validation", data.eval)):
        if rows is None:
            assert split not in info
            continue
        rows = list(rows)
        dropped = 0
        parquet = read_packed_parquet(tmp_path / "mdata" / f"{split}.idx.parquet")
        indexed = read_indexed_dataset(tmp_path / "mdata" / f"{split}_text_document")
        assert len(parquet) == len(rows) == len(indexed.document_indices) - 1 > 0
        for i, (row, stored) in enumerate(zip(rows, parquet)):
            assert stored.input_ids == list(row["input_ids"]), (split, i)
            # the stored mask marks exactly the predictions the HF path trains (no EOS rule applied)
            assert megatron_targets(stored, eos_id=None) == hf_targets(row), (split, i)
            # Megatron-Bridge's collate function also drops predictions made from an EOS input token
            # (ChatML's '<|im_end|>' -> '\n'); the writer counts them for the run's log
            dropped += len(hf_targets(row)) - len(megatron_targets(stored, tok.eos_token_id))
            doc = indexed.document(i)
            assert np.concatenate(doc).tolist() == list(row["input_ids"])
            assert [len(s) for s in doc] == np.diff(stored.seq_start_id + [len(stored.input_ids)]).tolist()
        assert info[split]["targets_dropped_after_eos"] == dropped
    if data.packed:
        assert any(len(r.seq_start_id) > 1 for r in parquet)  # several samples per row, boundaries kept


def test_first_token_of_a_packed_sample_is_never_a_target():
    # two samples [5,6,7] and [8,9]; labels as components.packing writes them (first of each -100)
    row = {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, 7, -100, 9], "position_ids": [0, 1, 2, 0, 1]}
    packed = to_packed_row(row)
    assert packed.seq_start_id == [0, 3] and packed.loss_mask == [0, 1, 0, 1, 0]
    assert megatron_targets(packed, eos_id=2) == hf_targets(row) == [(1, 7), (3, 9)]
    # EOS as an input token: Megatron's collate drops that position's loss
    assert megatron_targets(PackedRow([2, 6], [0], [1, 0]), eos_id=2) == []


def test_indexed_dataset_layout_matches_megatron_core(tmp_path):
    prefix = tmp_path / "d"
    assert write_indexed_dataset(prefix, [([1, 2, 3, 4], [3, 1]), ([5, 6], [2])], dtype=np.uint16) == (3, 2)
    raw = (tmp_path / "d.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and raw[9:17] == (1).to_bytes(8, "little") and raw[17] == 8  # uint16
    assert int.from_bytes(raw[18:26], "little") == 3 and int.from_bytes(raw[26:34], "little") == 3
    ds = read_indexed_dataset(prefix)
    assert ds.sequence_lengths.tolist() == [3, 1, 2] and ds.sequence_pointers.tolist() == [0, 6, 8]
    assert ds.document_indices.tolist() == [0, 2, 3]
    assert [s.tolist() for s in ds.document(0)] == [[1, 2, 3], [4]] and ds[2].tolist() == [5, 6]
    assert (tmp_path / "d.bin").stat().st_size == 12
