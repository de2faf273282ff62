"""What every distillation teacher gives: its top-k next-token log-probs (`TeacherTopK`), through the
`Teacher` protocol that the teacher loaded in the run and the served one both implement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class TeacherTopK:
    """A teacher's k most likely next tokens at each position."""

    logprobs: torch.Tensor  # [B, T, k] float32: log-probs of the teacher's k most likely next tokens at each position t (t predicts token t+1), at the requested temperature
    ids: torch.Tensor       # [B, T, k] int64 token ids


class Teacher(Protocol):
    """What the distill stage asks of a teacher, colocated or served."""

    def top_k(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, k: int,
              temperature: float) -> TeacherTopK: ...
