"""Adapters with peft: LoRA on any model, QLoRA on a bitsandbytes-quantized base."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    import torch

    from recipeforge.components.moe import LoraPlan

# bitsandbytes runs 4-bit layers on CPU from this release on; older ones need CUDA.
_BNB_CPU_MIN = (0, 48)


def lora_config(adapter, *, task_type: str = "CAUSAL_LM", trainable_tokens: dict | None = None,
                target_modules: list[str] | None = None, moe: LoraPlan | None = None):
    """The peft `LoraConfig` of an `adapter:` section (type lora or qlora); `trainable_tokens` (module
    name -> token ids) trains those embedding rows too (tokens the recipe added). `target_modules`
    (full module names) replaces `adapter.target_modules` once resolved against the model (a
    vision-language model's language side, `components.vision_model.lora_targets`). `moe` (a
    `components.moe.LoraPlan`): the expert weights, routers kept out and routers trained in full of
    a mixture-of-experts model."""
    from peft import LoraConfig

    target = adapter.target_modules if isinstance(adapter.target_modules, str) else list(adapter.target_modules)
    if target_modules is not None:
        target = list(target_modules)
    elif moe is not None and moe.target_modules is not None:
        target = list(moe.target_modules)
    save = list(adapter.modules_to_save) + (list(moe.modules_to_save) if moe is not None else [])
    extra: dict[str, Any] = {}
    if moe is not None:
        extra = {"target_parameters": list(moe.target_parameters) or None,
                 "exclude_modules": moe.exclude_modules[0] if moe.exclude_modules else None}
    return LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=adapter.dropout, target_modules=target,
                      modules_to_save=save or None, use_rslora=adapter.use_rslora,
                      use_dora=adapter.use_dora, bias="none", task_type=task_type,
                      trainable_token_indices=trainable_tokens or None, **extra)


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

    version = tuple(int(p) for p in bitsandbytes.__version__.split(".")[:2] if p.isdecimal())
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


def prepare_quantized(model, *, gradient_checkpointing: bool, device: str, sharded: bool = False):
    """peft's k-bit preparation, plus the CPU layout fix for 4-bit layers.

    `sharded` (ZeRO-3, FSDP): the base is partitioned like any other weights, which needs one dtype
    for all of them. The 4-bit weights are stored in the compute dtype (`quantization_config`), so
    peft's upcast of every other frozen weight to fp32 is skipped: they stay in the compute dtype
    (as in PEFT's and TRL's sharded QLoRA). The base is frozen and, for checkpointing, the
    embeddings' output requires grad, as peft's preparation would do.

    On CPUs with avx512_bf16, bitsandbytes repacks 4-bit weights into an inference-only layout the
    first time the model runs in eval mode, after which training breaks; switching that repacking
    off keeps evaluation during training safe.
    """
    if sharded:
        for param in model.parameters():
            param.requires_grad = False
        if gradient_checkpointing:
            model.enable_input_require_grads()
    else:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    if device != "cuda":
        import bitsandbytes as bnb

        for module in model.modules():
            if isinstance(module, bnb.nn.Linear4bit) and hasattr(module, "support_avx512bf16_for_cpu"):
                module.support_avx512bf16_for_cpu = False
    return model


def apply_lora(model, adapter, *, seed: int, gradient_checkpointing: bool = False,
               trainable_dtype: torch.dtype | None = None, trainable_tokens: dict | None = None,
               target_modules: list[str] | None = None, moe: LoraPlan | None = None) -> Any:
    """Wrap `model` with trainable LoRA adapters (base weights frozen), initialized from `seed`.

    `trainable_dtype` (a quantized base under ZeRO-3 or FSDP): every trainable parameter is cast to
    it. peft keeps LoRA weights in fp32 but copies `modules_to_save` in the base's 16-bit dtype, and
    both sharding engines need one dtype among the trainable parameters (ZeRO-3 flattens them into
    one buffer, deepspeed/runtime/zero/utils.py `defragment`; FSDP2 checks it per group,
    torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `_init_mp_dtypes`)."""
    import torch
    from peft import get_peft_model

    if gradient_checkpointing:
        # Frozen embeddings give the checkpointed blocks no input that requires grad.
        model.enable_input_require_grads()
    # LoRA A matrices start random: seed them, or two runs of one recipe start from different points.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(model, lora_config(adapter, trainable_tokens=trainable_tokens,
                                                  target_modules=target_modules, moe=moe))
    if moe is not None:
        from recipeforge.components.moe import check_lora_layout

        check_lora_layout(model, moe)
    if trainable_dtype is not None:
        for param in model.parameters():
            if param.requires_grad and param.dtype != trainable_dtype:
                param.data = param.data.to(trainable_dtype)
    return model
