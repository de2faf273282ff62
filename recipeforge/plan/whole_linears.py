"""Layouts that methods swapping whole linear layers cannot run, refused while the planner searches.

Quantization-aware training (`train.qat`, torchao's fake-quantized linears) and FP8 training
(`train.precision: fp8`, torchao's float8 linears) replace every `nn.Linear` of the model with their
own module. Tensor parallelism splits a linear layer's weight over processes, which neither swap
carries; QAT also needs each weight whole in its process (a DTensor shard or a ZeRO-3 partition is
not swapped), whereas FP8 runs on FSDP2's shards. The stages refuse such a plan at start-up
(`stages.fp8`, `backends.base`); here the same facts remove those layouts from the planner's
candidates, so `auto` plans a layout the run accepts, and a pinned one is refused at the method's key.
"""

from __future__ import annotations

from recipeforge.capabilities import Refusal

QAT_KEY = "train.qat"  # the keys `TrainConfig.linear_swap_keys` names
FP8_KEY = "train.precision"


def whole_linear_refusals(keys: tuple[str, ...], *, tensor_parallel: int, shards_weights: bool,
                          layout_name: str) -> list[Refusal]:
    """Why a layout (`layout_name`, e.g. "fsdp layout (fsdp_full_shard)") with these facts cannot run the
    methods of `keys` (empty when it can)."""
    out = []
    for key in keys:
        method = "quantization-aware training" if key == QAT_KEY else "fp8 training"
        if tensor_parallel > 1:
            out.append(Refusal(key, f"{method} swaps whole linear layers, and this layout splits them with tensor "
                                    f"parallelism ({tensor_parallel})",
                               hint="pin distributed.tensor_parallel: 1, or drop " + _drop(key)))
        elif key == QAT_KEY and shards_weights:
            out.append(Refusal(key, f"{method} swaps a whole model's linear layers for torchao's fake-quantized "
                                    f"ones, and the {layout_name} shards the weights across processes",
                               hint="pin distributed.backend: ddp (or deepspeed with distributed.zero_stage: 2), "
                                    "or drop train.qat"))
    return out


def _drop(key: str) -> str:
    return "train.qat" if key == QAT_KEY else "train.precision: fp8"
