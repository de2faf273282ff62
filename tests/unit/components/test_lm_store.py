"""Samples made on disk (`lm_store`): packing a memory-mapped dataset a chunk of bins at a time gives
exactly `pack_flat`'s sequences (bins, order, labels, positions) and counts, also over several chunks
and through an index mapping (a split or a mix); the tokenizer's chunks written to a `SampleFile`
read back as the table `encode_dataset` returns whole."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from recipeforge.components import lm_store
from recipeforge.components.lm_encode import to_arrow
from recipeforge.components.packing import IGNORE, pack_flat


def _samples(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=n).astype(np.int64)
    ids = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
    labels = np.where(rng.random(ids.shape) < 0.3, IGNORE, ids).astype(np.int32)
    return ids, labels, lengths


def _on_disk(tmp_path, ids, labels, lengths, chunks: int = 3):
    """The samples as a memory-mapped dataset written in `chunks` tables, as the tokenizer writes them."""
    out = lm_store.SampleFile(tmp_path / "tokenized.arrow")
    ends = np.concatenate(([0], np.cumsum(lengths)))
    for rows in np.array_split(np.arange(len(lengths)), chunks):
        a, b = int(ends[rows[0]]), int(ends[rows[-1] + 1])
        out.write(to_arrow({"input_ids": ids[a:b], "labels": labels[a:b]}, lengths[rows]))
    return out.dataset("test-tokenized")


def _columns(ds):
    table = ds.with_format("arrow")[:]
    flat = {k: np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in table.column(k).chunks])
            for k in ("input_ids", "labels", "position_ids")}
    per_row = np.concatenate([pc.list_value_length(c).to_numpy() for c in table.column("input_ids").chunks])
    return flat, per_row


@pytest.mark.parametrize("bins_per_chunk", [1, 7, 100_000])
def test_chunked_packing_is_pack_flat(tmp_path, monkeypatch, bins_per_chunk):
    monkeypatch.setattr(lm_store, "PACK_BINS", bins_per_chunk)
    ids, labels, lengths = _samples(300)
    ds = _on_disk(tmp_path, ids, labels, lengths)
    assert np.array_equal(lm_store.row_lengths(ds), lengths)
    out = lm_store.SampleFile(tmp_path / "packed.arrow")
    stats, trained = lm_store.pack_to_disk(ds, 128, out)
    expected, expected_stats = pack_flat(ids, labels, lengths, 128)
    got, per_row = _columns(out.dataset("test-packed"))
    for key in ("input_ids", "labels", "position_ids"):
        assert np.array_equal(got[key], expected[key]), key
    assert np.array_equal(per_row, expected["lengths"])
    assert stats == expected_stats and trained == int((labels != IGNORE).sum()) == lm_store.trained_tokens(ds)


def test_an_index_mapped_dataset_packs_in_its_own_row_order(tmp_path):
    ids, labels, lengths = _samples(200, seed=1)
    ds = _on_disk(tmp_path, ids, labels, lengths)
    split = ds.train_test_split(test_size=50, seed=3, shuffle=True)["train"]  # an index mapping over the file
    order = np.asarray(split._indices.column(0).to_numpy(), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    pick = np.concatenate([np.arange(starts[i], starts[i] + lengths[i]) for i in order])
    out = lm_store.SampleFile(tmp_path / "packed.arrow")
    lm_store.pack_to_disk(split, 100, out)
    expected, _ = pack_flat(ids[pick], labels[pick], lengths[order], 100)
    got, _ = _columns(out.dataset("split-packed"))
    assert all(np.array_equal(got[k], expected[k]) for k in ("input_ids", "labels", "position_ids"))


def test_an_empty_file_is_an_empty_dataset(tmp_path):
    ds = lm_store.SampleFile(tmp_path / "none.arrow").dataset("empty")
    assert len(ds) == 0 and lm_store.row_lengths(ds).size == 0 and lm_store.trained_tokens(ds) == 0
