"""`Linear`: one linear projection of a layer, as numbers (the unit the planner counts parameters,
LoRA adapters and quantized weights in)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Linear:
    """A linear projection inside one decoder layer (per layer, counted `count` times)."""

    name: str
    in_features: int
    out_features: int
    count: int = 1          # e.g. the number of experts holding this projection
    bias: bool = False

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))
