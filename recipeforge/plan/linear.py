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


def quantized_bytes_per_param(bits: int, double_quant: bool, hidden: int) -> float:
    """Bytes per weight of a bitsandbytes-quantized linear (Dettmers et al. 2023, QLoRA Sec. 3):
    NF4 stores 0.5 bytes plus one fp32 absmax per 64-weight block; double quantization stores those
    as 8-bit with one fp32 constant per 256 blocks. LLM.int8 stores 1 byte plus an fp32 scale per row."""
    if bits == 8:
        return 1.0 + 4 / hidden
    constants = (1 / 64 + 4 / (64 * 256)) if double_quant else 4 / 64
    return 0.5 + constants
