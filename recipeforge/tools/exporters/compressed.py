"""compressed-tensors exports (vLLM's own format) through llmcompressor's `oneshot`, data-free: the
weights are quantized from the model alone, activations (W8A8, FP8) at run time per token."""

from __future__ import annotations

import json
from pathlib import Path

from recipeforge.tools.exporters.formats import ExportFormat, int4_group

# llmcompressor's preset scheme of each format.
SCHEMES = {ExportFormat.W8A8: "W8A8", ExportFormat.W4A16: "W4A16", ExportFormat.FP8: "FP8_DYNAMIC"}


def quantization_modifier(fmt: ExportFormat, model_config: dict):
    """llmcompressor's `QuantizationModifier` for `fmt`: every linear layer but the output head, with
    the preset's settings; W4A16's group shrinks to one dividing the model's widths (tiny models)."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from llmcompressor.modifiers.quantization import QuantizationModifier

    scheme = preset_name_to_scheme(SCHEMES[fmt], ["Linear"])
    if scheme.weights is not None and scheme.weights.group_size:
        scheme.weights.group_size = int4_group(model_config)
    return QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"])


def quantize_compressed(fmt: ExportFormat, src: Path, dest: Path) -> dict:
    """Load `src`, quantize it with llmcompressor and save it compressed (safetensors and a
    compressed-tensors `quantization_config`), with the tokenizer."""
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((Path(src) / "config.json").read_text())
    modifier = quantization_modifier(fmt, config)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype="auto")
    oneshot(model=model, recipe=modifier)
    model.config.use_cache = True
    model.save_pretrained(str(dest), save_compressed=True)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dest))
    weights = modifier.config_groups["group_0"].weights
    return {"scheme": SCHEMES[fmt], "weights": f"{weights.type}{weights.num_bits}",
            "granularity": f"per group of {weights.group_size}" if weights.group_size else f"per {weights.strategy}",
            "dtype": str(model.dtype).removeprefix("torch.")}
