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
