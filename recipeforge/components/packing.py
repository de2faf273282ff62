"""Packing: several tokenized samples per training sequence, with no attention between them.

Samples are assigned to sequences by best-fit decreasing (few, nearly full sequences). Each packed
sequence carries `position_ids` that restart at 0 for every sample; the models build a
block-diagonal causal mask from them when no attention mask is passed (transformers'
`find_packed_sequence_indices`), so a token only sees earlier tokens of its own sample. The first
label of every sample is ignored, so the last token of one sample is never trained to predict the
first token of the next.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

IGNORE = -100


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Group sample indices into bins of at most `capacity` tokens (best-fit decreasing).

    Longest samples first, each into the fullest bin that still has room for it. Deterministic:
    ties keep the original order. Samples longer than `capacity` must be cut beforehand.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (remaining capacity, bin index)
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"sample {i} has {n} tokens, more than the capacity {capacity}")
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            remaining, b = free.pop(pos)
        else:
            b, remaining = len(bins), capacity
            bins.append([])
        bins[b].append(i)
        if remaining - n > 0:
            bisect.insort(free, (remaining - n, b))
    return bins


@dataclass(frozen=True)
class PackStats:
    """How well samples filled the packed sequences."""

    samples: int
    sequences: int
    tokens: int
    capacity: int

    @property
    def efficiency(self) -> float:
        """Share of the `sequences x capacity` token slots holding real tokens."""
        return self.tokens / (self.sequences * self.capacity) if self.sequences else 0.0


def pack(input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], capacity: int
         ) -> tuple[dict[str, list[list[int]]], PackStats]:
    """Pack tokenized samples into sequences of at most `capacity` tokens.

    Returns columns `input_ids`, `labels`, `position_ids` (one row per packed sequence) and stats.
    """
    lengths = [len(x) for x in input_ids]
    bins = best_fit_decreasing(lengths, capacity)
    out_ids, out_labels, out_pos = [], [], []
    for b in bins:
        ids: list[int] = []
        lab: list[int] = []
        pos: list[int] = []
        for i in sorted(b):  # original order inside a sequence: stable, readable
            ids.extend(input_ids[i])
            sample_labels = list(labels[i])
            sample_labels[0] = IGNORE  # would be predicted from the previous sample's last token
            lab.extend(sample_labels)
            pos.extend(range(lengths[i]))
        out_ids.append(ids)
        out_labels.append(lab)
        out_pos.append(pos)
    stats = PackStats(samples=len(lengths), sequences=len(bins), tokens=sum(lengths), capacity=capacity)
    return {"input_ids": out_ids, "labels": out_labels, "position_ids": out_pos}, stats


def segment_ids(position_ids: Sequence[int]) -> list[int]:
    """Which packed sample each position belongs to (a new sample starts where positions restart)."""
    out, seg = [], -1
    for i, p in enumerate(position_ids):
        if i == 0 or p != position_ids[i - 1] + 1:
            seg += 1
        out.append(seg)
    return out


def pack_flat(ids, labels, lengths, capacity: int) -> tuple[dict, PackStats]:
    """`pack` on flat arrays: samples end to end in `ids`/`labels` (numpy), `lengths` per sample.

    The same bins and the same rows as `pack`, built with array operations: returns flat ``input_ids``,
    ``labels`` and ``position_ids`` (int32) of all sequences end to end, ``lengths`` per sequence, and stats.
    """
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    bins = best_fit_decreasing(lengths.tolist(), capacity)
    order = np.fromiter((i for b in bins for i in sorted(b)), dtype=np.int64, count=len(lengths))
    sample_len = lengths[order]
    starts = (np.cumsum(lengths) - lengths)[order]
    index = gather_index(starts, sample_len)
    first = np.cumsum(sample_len) - sample_len  # where each sample begins in the packed output
    out_labels = np.asarray(labels)[index]
    out_labels[first[sample_len > 0]] = IGNORE  # would be predicted from the previous sample's last token
    positions = (np.arange(len(index), dtype=np.int64) - np.repeat(first, sample_len)).astype(np.int32)
    per_bin = np.add.reduceat(sample_len, np.cumsum([0] + [len(b) for b in bins[:-1]])) if bins else sample_len
    stats = PackStats(samples=len(lengths), sequences=len(bins), tokens=int(lengths.sum()), capacity=capacity)
    return {"input_ids": np.asarray(ids)[index], "labels": out_labels, "position_ids": positions,
            "lengths": per_bin}, stats


def gather_index(starts, lengths):
    """Positions ``starts[0] .. starts[0]+lengths[0]-1, starts[1] ..``: the index that gathers slices end to end."""
    import numpy as np

    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    first = np.cumsum(lengths) - lengths  # where each slice begins in the output
    return np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)
