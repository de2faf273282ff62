"""Batching tokenized causal-LM rows, counting how much of each batch is padding."""

from __future__ import annotations

from dataclasses import dataclass, field

IGNORE = -100


@dataclass
class PaddingCounter:
    """Real vs. total tokens of the batches built so far (the padding share the run reports)."""

    real: int = 0
    total: int = 0

    def take(self) -> dict[str, float]:
        """The padding share since the last call, then reset."""
        out = {"padding_share": 1.0 - self.real / self.total} if self.total else {}
        self.real = self.total = 0
        return out


@dataclass
class LMCollator:
    """Right-pads rows of `input_ids`/`labels` (and `position_ids` for packed rows) into tensors.

    Packed rows get no attention mask: the model derives the block-diagonal mask from the
    position ids, and padding forms its own block after the real tokens (positions restart at 0),
    which causal attention never lets a real token see. Unpacked rows get the usual attention mask.
    """

    pad_token_id: int
    packed: bool
    pad_to_multiple_of: int | None = None
    counter: PaddingCounter = field(default_factory=PaddingCounter)

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        lengths = [len(r["input_ids"]) for r in rows]
        width = max(lengths)
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            width = (width + m - 1) // m * m
        n = len(rows)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE, dtype=torch.long)
        extra = torch.zeros((n, width), dtype=torch.long)  # position ids or attention mask
        for i, (row, length) in enumerate(zip(rows, lengths)):
            input_ids[i, :length] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            labels[i, :length] = torch.as_tensor(row["labels"], dtype=torch.long)
            if self.packed:
                extra[i, :length] = torch.as_tensor(row["position_ids"], dtype=torch.long)
                extra[i, length:] = torch.arange(width - length)
            else:
                extra[i, :length] = 1
        self.counter.real += sum(lengths)
        self.counter.total += n * width
        if self.packed:
            # A KV cache makes the models skip the packed-sequence mask: never build one here.
            return {"input_ids": input_ids, "labels": labels, "position_ids": extra, "use_cache": False}
        return {"input_ids": input_ids, "labels": labels, "attention_mask": extra}


def pad_multiple(device: str) -> int | None:
    """Width multiple to pad unpacked batches to: 8 on GPUs, where 16-bit matmuls run on tensor cores
    at full speed when their dimensions are multiples of 8; none on the CPU, where padding only costs.
    (Packed rows already fill `data.sequence_len`.)"""
    return 8 if device == "cuda" else None
