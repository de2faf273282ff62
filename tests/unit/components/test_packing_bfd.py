"""Best-fit-decreasing packing: every sample exactly once, bins within capacity, positions restart."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipeforge.components.packing import IGNORE, PackStats, best_fit_decreasing, pack, segment_ids


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=0, max_size=200), st.integers(64, 256))
def test_bins_hold_every_sample_once_within_capacity(lengths, capacity):
    bins = best_fit_decreasing(lengths, capacity)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    # best fit never leaves two bins that could have been one
    loads = sorted(sum(lengths[i] for i in b) for b in bins)
    assert len(loads) < 2 or loads[0] + loads[1] > capacity or len(bins) == 1


def test_too_long_sample_is_refused():
    with pytest.raises(ValueError):
        best_fit_decreasing([10, 300], 256)


def test_efficiency_on_many_short_samples():
    rng = random.Random(0)
    lengths = [rng.randint(5, 200) for _ in range(5000)]
    bins = best_fit_decreasing(lengths, 1024)
    eff = PackStats(len(lengths), len(bins), sum(lengths), 1024).efficiency
    assert eff > 0.99


def test_pack_resets_positions_and_ignores_first_label_of_each_sample():
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    labels = [[1, 2, 3], [IGNORE, 5], [6, 7, IGNORE, 9]]
    cols, stats = pack(ids, labels, 9)
    assert stats.sequences == 1 and stats.tokens == 9 and stats.efficiency == 1.0
    (row_ids,), (row_labels,), (row_pos,) = cols["input_ids"], cols["labels"], cols["position_ids"]
    assert row_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert row_pos == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert row_labels == [IGNORE, 2, 3, IGNORE, 5, IGNORE, 7, IGNORE, 9]
    assert segment_ids(row_pos) == [0, 0, 0, 1, 1, 2, 2, 2, 2]


def test_segment_ids_of_one_token_samples():
    assert segment_ids([0, 0, 0, 1]) == [0, 1, 2, 2]
