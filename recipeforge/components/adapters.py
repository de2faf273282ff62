"""Adapters with peft: LoRA on any model, QLoRA on a bitsandbytes-quantized base."""

from __future__ import annotations

import importlib.util
from typing import Any

from recipeforge.errors import Location, RecipeError

# bitsandbytes runs 4-bit layers on CPU from this release on; older ones need CUDA.
_BNB_CPU_MIN = (0, 48)


def lora_config(adapter, *, task_type: str = "CAUSAL_LM"):
    """The peft `LoraConfig` of an `adapter:` section (type lora or qlora)."""
    from peft import LoraConfig

    target = adapter.target_modules if isinstance(adapter.target_modules, str) else list(adapter.target_modules)
    return LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=adapter.dropout, target_modules=target,
                      modules_to_save=list(adapter.modules_to_save) or None, use_rslora=adapter.use_rslora,
                      use_dora=adapter.use_dora, bias="none", task_type=task_type)


def check_bitsandbytes(device: str, *, what: str = "QLoRA", key: str = "adapter.type",
                       location: Location | None = None) -> None:
    """Fail with a clear message when bitsandbytes is missing or cannot run on `device`."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RecipeError(f"{what} needs the bitsandbytes package, which is not installed", key=key,
                          location=location,
                          hint="pip install 'recipeforge[qlora]', or use adapter.type: lora")
    if device == "cuda":
        return
    import bitsandbytes

    version = tuple(int(p) for p in bitsandbytes.__version__.split(".")[:2] if p.isdigit())
    if version < _BNB_CPU_MIN:
        raise RecipeError(f"{what} on CPU needs bitsandbytes >= {'.'.join(map(str, _BNB_CPU_MIN))} "
                          f"(installed: {bitsandbytes.__version__}); older releases need a CUDA GPU",
                          key=key, location=location,
                          hint="upgrade bitsandbytes, run on a GPU, or use adapter.type: lora")


def quantization_config(adapter, compute_dtype, device: str, *, location: Location | None = None):
    """The transformers `BitsAndBytesConfig` for QLoRA (checks bitsandbytes first)."""
    check_bitsandbytes(device, location=location)
    from transformers import BitsAndBytesConfig

    q = adapter.quant
    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.quant_type,
                              bnb_4bit_use_double_quant=q.double_quant, bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_quant_storage=compute_dtype)


def prepare_quantized(model, *, gradient_checkpointing: bool, device: str):
    """peft's k-bit preparation, plus the CPU layout fix for 4-bit layers.

    On CPUs with avx512_bf16, bitsandbytes repacks 4-bit weights into an inference-only layout the
    first time the model runs in eval mode, after which training breaks; switching that repacking
    off keeps evaluation during training safe.
    """
    from peft import prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    if device != "cuda":
        import bitsandbytes as bnb

        for module in model.modules():
            if isinstance(module, bnb.nn.Linear4bit) and hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return model


def apply_lora(model, adapter, *, seed: int, gradient_checkpointing: bool = False) -> Any:
    """Wrap `model` with trainable LoRA adapters (base weights frozen), initialized from `seed`."""
    import torch
    from peft import get_peft_model

    if gradient_checkpointing:
        # Frozen embeddings give the checkpointed blocks no input that requires grad.
        model.enable_input_require_grads()
    # LoRA A matrices start random: seed them, or two runs of one recipe start from different points.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lora_config(adapter))
