"""Writing one export folder from a folder of full weights: a copy (safetensors), torchao weight-only
quantization through transformers' `TorchAoConfig`, or (module `compressed`) llmcompressor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from recipeforge.tools.exporters.formats import ExportFormat, Family, FormatSpec, int4_group


def write_export(spec: FormatSpec, src: Path, dest: Path, *, group: int | None = None) -> dict:
    """Write `spec`'s format of the model in `src` (full weights and tokenizer) into the empty folder
    `dest`; returns what was chosen on the way (recorded in export.json). `group`: the int4 group size
    the run trained for (`train.qat`), else the export's own choice (`int4_group`)."""
    if spec.family == Family.SAFETENSORS:
        return copy_weights(src, dest)
    if spec.family == Family.TORCHAO:
        return quantize_torchao(spec.name, src, dest, group=group)
    if spec.family == Family.COMPRESSED_TENSORS:
        from recipeforge.tools.exporters.compressed import quantize_compressed

        return quantize_compressed(spec.name, src, dest)
    raise AssertionError(f"no writer for {spec.name}")  # formats.check_available refused it before


def copy_weights(src: Path, dest: Path) -> dict:
    """The full-precision model as it is: every file of `src` (weights, config, tokenizer)."""
    for path in sorted(Path(src).iterdir()):
        # The export writes its own README; hidden files (a marker of the folder copied) are not the model's.
        if path.is_file() and path.name != "README.md" and not path.name.startswith("."):
            shutil.copy2(path, dest / path.name)
    return {"dtype": json.loads((Path(src) / "config.json").read_text()).get("dtype")}


def torchao_config(fmt: ExportFormat, model_config: dict, group: int | None = None):
    """The torchao config of `fmt` for a model with `model_config` (its config.json), and its settings.

    int4 is torchao's `IntxWeightOnlyConfig(torch.int4, PerGroup)`: with torchao 0.15+ the
    `Int4WeightOnlyConfig` layouts run only on CUDA (tinygemm tile packing, bf16) or need the mslk
    kernels, and the CPU layout (Int4CPULayout) is gone; the unpacked int4 tensor loads and runs on the
    CPU and the GPU alike, and it is the only int4 layout torchao's safetensors support serializes. It
    keeps one int4 value per byte: on disk it is as large as int8 (W4A16 packs two per byte). int8-int4
    is `Int8DynamicActivationIntxWeightConfig(torch.int4, PerGroup)`, the same weights with each linear
    layer's input quantized to int8 per token at run time. Both are the configs `train.qat` simulates
    (`components.qat.base_config`)."""
    from torchao.quantization import Int8WeightOnlyConfig

    from recipeforge.components.qat import QATScheme, base_config

    if fmt == ExportFormat.TORCHAO_INT8:
        return Int8WeightOnlyConfig(), {"weights": "int8", "granularity": "per channel"}
    chosen = group or int4_group(model_config)
    settings = {"weights": "int4", "granularity": f"per group of {chosen}", "storage": "one value per byte"}
    if group:
        settings["groups_from"] = "train.qat.group_size (the groups the run trained with fake-quantized)"
    if fmt == ExportFormat.TORCHAO_INT8_INT4:
        settings["activations"] = "int8, dynamic, per token"
        return base_config(QATScheme.INT8_DYNAMIC_ACT_INT4_WEIGHT, chosen), settings
    return base_config(QATScheme.INT4_WEIGHT, chosen), settings


def quantize_torchao(fmt: ExportFormat, src: Path, dest: Path, *, group: int | None = None) -> dict:
    """Load `src` quantized by torchao (every linear layer but the output head and the embeddings,
    transformers' default) and save it as safetensors with its `quantization_config`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, TorchAoConfig

    config = json.loads((Path(src) / "config.json").read_text())
    quant, settings = torchao_config(fmt, config, group)
    # dtype "auto": the weights keep the precision they were trained and saved in.
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype="auto", quantization_config=TorchAoConfig(quant))
    model.config.use_cache = True
    model.save_pretrained(str(dest), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(dest))
    return {**settings, "dtype": str(model.dtype).removeprefix("torch.")}


def qat_settings(run_dir: Path) -> tuple[str, int] | None:
    """The scheme and int4 group size a run trained its weights for (`train.qat` in its
    resolved_recipe.yaml), None when it trained without quantization-aware training."""
    import yaml

    path = Path(run_dir) / "resolved_recipe.yaml"
    recipe = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    qat = (recipe.get("train") or {}).get("qat") if isinstance(recipe, dict) else None
    if not isinstance(qat, dict):
        return None
    scheme, group = qat.get("scheme"), qat.get("group_size")
    if not isinstance(scheme, str) or not isinstance(group, int) or group <= 0:
        return None
    return scheme, group
