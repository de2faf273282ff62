"""`adapter:` — full fine-tuning, LoRA or QLoRA (peft, bitsandbytes)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import Field

from recipeforge.capabilities import ADAPTERS
from recipeforge.config.schema.base import Section


class QuantConfig(Section):
    """How QLoRA quantizes the frozen base weights (bitsandbytes)."""

    bits: Literal[4, 8] = Field(4, description="Base weight precision in bits.")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type (NF4 from the QLoRA paper).")
    double_quant: bool = Field(True, description="Quantize the quantization constants too (saves ~0.4 bit/param).")


class AdapterConfig(Section):
    """Parameter-efficient fine-tuning. `none` trains every weight."""

    type: Literal[ADAPTERS] = Field(
        "none", description="`none`: full fine-tune; `lora`: low-rank adapters on frozen weights; "
                            "`qlora`: LoRA on a 4-bit quantized base (needs the `qlora` extra).")
    r: int = Field(16, gt=0, le=4096, description="LoRA rank.")
    alpha: float = Field(32, gt=0, description="LoRA scaling numerator (scale = alpha / r, or alpha/sqrt(r) with rslora).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: Union[Literal["all-linear"], tuple[str, ...]] = Field(
        "all-linear", description="Modules that get adapters: `all-linear` or a list of module names "
                                  "(e.g. [q_proj, v_proj]).")
    modules_to_save: tuple[str, ...] = Field(
        (), description="Modules trained in full next to the adapters (e.g. [embed_tokens, lm_head]).")
    use_rslora: bool = Field(False, description="Rank-stabilized LoRA scaling.")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA).")
    quant: QuantConfig = Field(default_factory=QuantConfig, description="QLoRA quantization settings.")
