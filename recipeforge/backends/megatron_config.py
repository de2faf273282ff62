"""Recipe + Plan -> Megatron-Bridge configuration, as plain data (pure: no Megatron import).

The result is a mapping from `ConfigContainer` section (``model``, ``train``, ``validation``,
``optimizer``, ``scheduler``, ``ddp``, ``dataset``, ``checkpoint``, ``logger``, ``tokenizer``, ``rng``,
``peft``) to the field values of that section's Megatron-Bridge dataclass, plus ``mixed_precision``
(a recipe name such as ``bf16_mixed``). `backends.megatron` applies it to the real objects and refuses
fields the installed Megatron-Bridge does not have, so a renamed field fails loudly instead of being
ignored.
"""

from __future__ import annotations

from pathlib import Path

from recipeforge.errors import RecipeError

# Megatron-Core names of the linear layers LoRA adapts (q/k/v are fused into linear_qkv, gate/up into linear_fc1).
_LORA_TARGETS = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
                 "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2"}
ALL_LINEAR = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
_DECAY = {"linear": "linear", "cosine": "cosine", "cosine_with_min_lr": "cosine", "constant": "constant",
          "constant_with_warmup": "constant", "wsd": "WSD"}


def megatron_config(plan, recipe, *, run_dir: Path, data: dict, train_iters: int) -> dict:
    """Megatron-Bridge settings for `recipe` under `plan`.

    `data` describes the prepared dataset: ``{"kind": "pretrain", "prefix": PATH}`` for an indexed
    token dataset, or ``{"kind": "sft", "root": DIR}`` for JSONL input/output rows. `train_iters` is the
    number of optimizer steps (the recipe's max_steps, or epochs over the data, computed by the caller).
    """
    from recipeforge.plan.artifacts import megatron_parallel_settings

    if plan.backend != "megatron":
        raise RecipeError(f"the plan uses backend {plan.backend}, not megatron", key="distributed.backend")
    r, t, o = recipe, recipe.train, recipe.output
    par = megatron_parallel_settings(plan, recipe)
    dtype = plan.extra.get("dtype", "bf16")
    seq = r.data.sequence_len
    warmup = t.warmup_steps if t.warmup_steps is not None else int(round(t.warmup_ratio * train_iters))
    model = {**{k: v for k, v in par["model"].items() if v is not None}, "seq_length": seq,
             "bf16": dtype == "bf16", "fp16": dtype == "fp16",
             "params_dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(dtype, "float32"),
             "pipeline_dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(dtype) if plan.pipeline_parallel > 1
             else None}
    ckpt = run_dir / "checkpoints"
    config: dict = {
        "model": model,
        "train": {"train_iters": train_iters, "global_batch_size": plan.global_batch_size,
                  "micro_batch_size": plan.micro_batch_size},
        "validation": {"eval_interval": t.eval_steps or o.save_steps or train_iters,
                       "eval_iters": 0 if not r.data.eval_datasets and not r.data.val_size else 8},
        "optimizer": {"optimizer": "adam", "lr": t.learning_rate,
                      "min_lr": 0.1 * t.learning_rate if t.scheduler == "cosine_with_min_lr" else 0.0,
                      "weight_decay": t.weight_decay, "adam_beta1": t.adam_beta1, "adam_beta2": t.adam_beta2,
                      "adam_eps": 1e-8, "bf16": dtype == "bf16", "fp16": dtype == "fp16",
                      **{k: v for k, v in par["optimizer"].items()}},
        "scheduler": {"lr_decay_style": _DECAY[t.scheduler], "lr_warmup_iters": warmup, "lr_warmup_init": 0.0,
                      "lr_decay_iters": train_iters, "override_opt_param_scheduler": True,
                      "start_weight_decay": t.weight_decay, "end_weight_decay": t.weight_decay,
                      "weight_decay_incr_style": "constant"},
        "ddp": {**par["ddp"], "check_for_nan_in_grad": True, "overlap_grad_reduce": plan.data_parallel > 1,
                "overlap_param_gather": plan.data_parallel > 1, "average_in_collective": True},
        "checkpoint": {"save": str(ckpt), "load": str(ckpt), "save_interval": o.save_steps or train_iters,
                       "ckpt_format": "torch_dist", "fully_parallel_save": True,
                       "pretrained_checkpoint": str(run_dir / "megatron_base")},
        "logger": {"log_interval": t.logging_steps,
                   "tensorboard_dir": str(run_dir / "tensorboard") if r.logging.tensorboard else None},
        "tokenizer": {"tokenizer_type": "HuggingFaceTokenizer",
                      "tokenizer_model": r.model.tokenizer or r.model.name_or_path},
        "rng": {"seed": t.seed},
        "mixed_precision": {"bf16": "bf16_mixed", "fp16": "fp16_mixed"}.get(dtype),
        "dataset": _dataset(data, seq, t.seed, r.data.packing),
        "peft": _lora(recipe),
    }
    if t.scheduler == "wsd":
        # The same phases as the transformers trainers (`components.schedules`): Megatron's WSD holds
        # the peak until the last `lr_wsd_decay_iters` iterations of `lr_decay_iters`.
        from recipeforge.components.schedules import DECAY_TYPE, wsd_phases

        phases = wsd_phases(train_iters, warmup, t.decay_ratio)
        config["scheduler"].update(lr_warmup_iters=phases.warmup, lr_wsd_decay_iters=phases.decay,
                                   lr_wsd_decay_style=DECAY_TYPE)
    if t.gradient_checkpointing is False:
        for key in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
            config["model"].pop(key, None)
    return config


def _dataset(data: dict, seq: int, seed: int, packing: bool) -> dict:
    kind = data.get("kind")
    if kind == "pretrain":
        # GPTDatasetConfig over one indexed dataset (.bin/.idx) with no held-out split of its own.
        return {"kind": "gpt", "blend": [[str(data["prefix"])], None], "seq_length": seq, "random_seed": seed,
                "split": "1,0,0" if not data.get("has_eval") else "99,1,0", "reset_position_ids": packing,
                "reset_attention_mask": packing, "eod_mask_loss": False, "dataloader_type": "single",
                "num_dataset_builder_threads": 1}
    if kind == "sft":
        # Finetuning dataset: dataset_root holds training.jsonl (and validation.jsonl) of input/output rows.
        return {"kind": "sft", "dataset_root": str(data["root"]), "seq_length": seq, "seed": seed,
                "dataloader_type": "batch", "do_validation": bool(data.get("has_eval")), "do_test": False}
    raise ValueError(f"unknown dataset kind {kind!r}")


def _lora(recipe) -> dict | None:
    a = recipe.adapter
    if a.type == "none":
        return None
    if a.type != "lora":
        raise RecipeError(f"adapter {a.type} is not supported on the megatron backend", key="adapter.type",
                          hint="use adapter.type: lora")
    targets = a.target_modules
    if targets in ("all-linear", ["all-linear"]):
        modules = list(ALL_LINEAR)
    else:
        names = [targets] if isinstance(targets, str) else list(targets)
        unknown = [n for n in names if n not in _LORA_TARGETS and n not in ALL_LINEAR]
        if unknown:
            raise RecipeError(f"LoRA target modules {unknown} have no Megatron-Core counterpart", key="adapter.target_modules",
                              hint=f"use all-linear or names from {sorted(_LORA_TARGETS)}")
        modules = list(dict.fromkeys(_LORA_TARGETS.get(n, n) for n in names))
    return {"target_modules": modules, "dim": a.r, "alpha": a.alpha, "dropout": a.dropout,
            "dropout_position": "pre", "lora_A_init_method": "xavier", "lora_B_init_method": "zero"}
