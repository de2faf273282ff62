"""The data a stage trains on, once prepared: one frozen record.

Whatever a stage does to its datasets (tokenize, mask and pack for pretraining and SFT; read, render
and check rows for the trainers that tokenize themselves), it ends with a `PreparedData`: the train
and eval sets, the statistics the run reports, and for tokenized data the cache entry
(the collator is built with the trainer: its padding depends on the device of the plan).
Checks on the numbers (`components.data_checks`) and the trainer read this record, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PreparedData:
    """Prepared train/eval sets of a stage (see the module docstring)."""

    train: Any                                     # a datasets.Dataset
    eval: Any = None                               # a datasets.Dataset, or None without eval data
    stats: dict[str, Any] = field(default_factory=dict)
    unit: str = "rows"                             # what one training example is called in messages
    packed: bool = False                           # sequences packed together (position ids restart)
    fingerprint: str = ""                          # the tokenized-data cache entry, when there is one
    cache_path: Path | None = None

    @property
    def has_eval(self) -> bool:
        """Whether there is an evaluation split."""
        return self.eval is not None

    def describe(self) -> str:
        """The one-line summary the run prints: ``data: key=value, ...``."""
        return "data: " + ", ".join(f"{k}={v}" for k, v in self.stats.items())

    def with_stats(self, **more: Any) -> "PreparedData":
        """The same data with statistics added."""
        return replace(self, stats={**self.stats, **more})
