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
from typing import TYPE_CHECKING, Any

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.config.schema import OutputConfig, Recipe, TrainConfig
    from recipeforge.plan.types import Plan

# Megatron-Core names of the linear layers LoRA adapts (q/k/v are fused into linear_qkv, gate/up into linear_fc1).
_LORA_TARGETS = {"q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
                 "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2"}
ALL_LINEAR = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
_DECAY = {"linear": "linear", "cosine": "cosine", "cosine_with_min_lr": "cosine", "constant": "constant",
          "constant_with_warmup": "constant", "wsd": "WSD"}


def megatron_config(plan: Plan, recipe: Recipe, *, run_dir: Path, data: dict[str, Any], train_iters: int,
                    base_checkpoint: Path | None = None) -> dict[str, Any]:
    """Megatron-Bridge settings for `recipe` under `plan`.

    `data` describes the prepared dataset, as `components.megatron_data.write_megatron_data` returns
    it: ``root``, ``training`` / ``validation`` (``parquet`` path, ``rows``) and ``metadata``. Both
    stages train on those packed rows through Megatron-Bridge's `GPTSFTDatasetConfig` with offline
    packing. `train_iters` is the number of optimizer steps (the recipe's max_steps, or epochs over
    the data, computed by the caller). `base_checkpoint` is the converted Hugging Face model
    (`backends.megatron_convert.import_checkpoint`) training starts from.
    """
    from recipeforge.backends.artifacts import megatron_parallel_settings

    if plan.backend != "megatron":
        raise RecipeError(f"the plan uses backend {plan.backend}, not megatron", key="distributed.backend")
    t = recipe.train
    par = megatron_parallel_settings(plan, recipe)
    if t.optimizer == "sgd" and plan.offload != "none":
        raise RecipeError("Megatron-Core offloads Adam's states only; SGD cannot run with the optimizer on the CPU",
                          key="train.optimizer", hint="use adamw, or distributed.offload: none")
    dtype = (plan.extra.dtype or "bf16")
    warmup = t.warmup_steps if t.warmup_steps is not None else int(round(t.warmup_ratio * train_iters))
    config = _sections(plan, recipe, par, dtype=dtype, warmup=warmup, run_dir=run_dir, data=data,
                       train_iters=train_iters, base_checkpoint=base_checkpoint)
    if t.scheduler == "wsd":
        _wsd_phases(config["scheduler"], train_iters, warmup, t.decay_ratio)
    if t.gradient_checkpointing is False:
        for key in ("recompute_granularity", "recompute_method", "recompute_num_layers"):
            config["model"].pop(key, None)
    return config


def _sections(plan: Plan, recipe: Recipe, par: dict[str, Any], *, dtype: str, warmup: int, run_dir: Path,
              data: dict[str, Any], train_iters: int, base_checkpoint: Path | None) -> dict[str, Any]:
    """Every `ConfigContainer` section, before the WSD phases and the recompute switch are applied."""
    r, t, o = recipe, recipe.train, recipe.output
    seq = r.data.sequence_len
    return {
        "model": _model(plan, par, dtype, seq),
        # Packed rows go one per micro batch (Megatron-Bridge requires it with offline packing; the
        # planner plans micro batch 1 for megatron), so a step sees the global batch of rows as elsewhere.
        "train": {"train_iters": train_iters, "global_batch_size": plan.global_batch_size,
                  "micro_batch_size": 1,
                  # SIGTERM (forwarded by the launcher on a stop request or preemption): Megatron saves a
                  # checkpoint at the end of the iteration and leaves its loop; the stage reports the stop.
                  "exit_signal_handler": True},
        # The loss checked every step for NaN/inf, as the other backends' divergence watch does
        # (train.divergence.stop_on_nan). Megatron's own spike check is not the recipe's (window,
        # factor, patience), so it stays off and the recipe's spike keys are refused with this backend.
        "rerun_state_machine": {"check_for_nan_in_loss": t.divergence.stop_on_nan, "check_for_spiky_loss": False},
        "validation": {"eval_interval": t.eval_steps or o.save_steps or train_iters,
                       "eval_iters": _eval_iters(data, plan.global_batch_size)},
        "optimizer": _optimizer_section(t, par, dtype),
        "scheduler": _scheduler(t, warmup, train_iters),
        "ddp": {**par["ddp"], "check_for_nan_in_grad": t.divergence.stop_on_nan, "overlap_grad_reduce": plan.data_parallel > 1,
                "overlap_param_gather": plan.data_parallel > 1, "average_in_collective": True},
        "checkpoint": _checkpoint(o, run_dir, train_iters, base_checkpoint),
        "logger": _logger(r, run_dir),
        "dist": {"distributed_timeout_minutes": max(1, int(round(r.distributed.timeout_minutes)))},
        # the tokenizer the data was tokenized with, as the Megatron stage saved it next to the data (a
        # `tiny:` tokenizer, built locally, has no hub id to load it by)
        "tokenizer": {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": str(Path(data["root"]) / "tokenizer")},
        "rng": {"seed": t.seed},
        "mixed_precision": {"bf16": "bf16_mixed", "fp16": "fp16_mixed"}.get(dtype),
        "dataset": _dataset(data, seq, t.seed, max_samples=train_iters * plan.global_batch_size),
        "peft": _lora(recipe),
    }


def _model(plan: Plan, par: dict[str, Any], dtype: str, seq: int) -> dict[str, Any]:
    """The model section: the plan's parallel layout, the sequence length and the precision."""
    return {**{k: v for k, v in par["model"].items() if v is not None}, "seq_length": seq,
            "bf16": dtype == "bf16", "fp16": dtype == "fp16",
            "params_dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(dtype, "float32"),
            "pipeline_dtype": {"bf16": "bfloat16", "fp16": "float16"}.get(dtype) if plan.pipeline_parallel > 1
            else None}


def _optimizer_section(t: TrainConfig, par: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The optimizer section: `_optimizer`'s choice, learning rate, weight decay, precision, sharding."""
    return {**_optimizer(t), "lr": t.learning_rate,
            "min_lr": 0.1 * t.learning_rate if t.scheduler == "cosine_with_min_lr" else 0.0,
            "weight_decay": t.weight_decay, "bf16": dtype == "bf16", "fp16": dtype == "fp16",
            **{k: v for k, v in par["optimizer"].items()}}


def _scheduler(t: TrainConfig, warmup: int, train_iters: int) -> dict[str, Any]:
    """The scheduler section: decay style, warmup, and a constant weight decay."""
    return {"lr_decay_style": _DECAY[t.scheduler], "lr_warmup_iters": warmup, "lr_warmup_init": 0.0,
            "lr_decay_iters": train_iters, "override_opt_param_scheduler": True,
            "start_weight_decay": t.weight_decay, "end_weight_decay": t.weight_decay,
            "weight_decay_incr_style": "constant"}


def _wsd_phases(scheduler: dict[str, Any], train_iters: int, warmup: int, decay_ratio: float) -> None:
    """Set the warmup-stable-decay phases in the scheduler section."""
    # The same phases as the transformers trainers (`components.schedules`): Megatron's WSD holds
    # the peak until the last `lr_wsd_decay_iters` iterations of `lr_decay_iters`.
    from recipeforge.components.schedules import DECAY_TYPE, wsd_phases

    phases = wsd_phases(train_iters, warmup, decay_ratio)
    scheduler.update(lr_warmup_iters=phases.warmup, lr_wsd_decay_iters=phases.decay,
                     lr_wsd_decay_style=DECAY_TYPE)


def _checkpoint(o: OutputConfig, run_dir: Path, train_iters: int, base_checkpoint: Path | None) -> dict[str, Any]:
    """The checkpoint section: saves under RUN_DIR/checkpoints, resumed from there when output.resume is auto."""
    ckpt = run_dir / "checkpoints"
    # output.resume: never starts from the converted base even when checkpoints exist.
    return {"save": str(ckpt), "load": str(ckpt) if o.resume == "auto" else None,
            "save_interval": o.save_steps or train_iters, "most_recent_k": o.save_total_limit or -1,
            "ckpt_format": "torch_dist", "fully_parallel_save": True,
            "pretrained_checkpoint": str(base_checkpoint) if base_checkpoint else None}


def _dataset(data: dict[str, Any], seq: int, seed: int, *, max_samples: int) -> dict[str, Any]:
    """GPTSFTDatasetConfig over the packed rows recipeforge wrote (`components.megatron_data`): offline
    packing with explicit paths, so Megatron-Bridge neither tokenizes nor packs anything itself."""
    val = data.get("validation")
    return {"kind": "sft", "seq_length": seq, "dataset_root": str(data["root"]), "seed": seed,
            # a sample count makes the dataset reshuffle its rows every epoch (with `seed`), as the
            # HF trainers' random sampler does
            "max_train_samples": max_samples,
            "enable_offline_packing": True,
            "offline_packing_specs": {"packed_sequence_size": seq,
                                      "packed_train_data_path": str(data["training"]["parquet"]),
                                      "packed_val_data_path": str(val["parquet"]) if val else None,
                                      "packed_metadata_path": str(data["metadata"])},
            # the stored loss mask is the HF path's label mask (answer-only loss reads it as is)
            "dataset_kwargs": {"answer_only_loss": True},
            "do_validation": val is not None, "do_test": False, "dataloader_type": "batch"}


def _eval_iters(data: dict[str, Any], global_batch: int) -> int:
    """Evaluation covers the whole validation split, as the HF trainers' evaluation does."""
    val = data.get("validation")
    return -(-val["rows"] // global_batch) if val else 0


def _optimizer(t: TrainConfig) -> dict[str, Any]:
    """Megatron-Core's optimizer for `train.optimizer`: Adam with decoupled weight decay (AdamW) or
    SGD. Values the HF path takes from TrainingArguments' defaults are written out: Adam's epsilon
    1e-8, and no SGD momentum (transformers' `sgd` is torch.optim.SGD with its defaults)."""
    if t.optimizer in ("adamw", "adamw_fused"):
        return {"optimizer": "adam", "decoupled_weight_decay": True, "adam_beta1": t.adam_beta1,
                "adam_beta2": t.adam_beta2, "adam_eps": 1e-8}
    if t.optimizer == "sgd":
        return {"optimizer": "sgd", "sgd_momentum": 0.0}
    raise RecipeError(f"optimizer {t.optimizer} is not supported on the megatron backend", key="train.optimizer",
                      hint="use adamw, adamw_fused or sgd")


def _logger(r: Recipe, run_dir: Path) -> dict[str, Any]:
    """Logging interval and the experiment trackers of the recipe."""
    lg = r.logging
    out: dict[str, Any] = {"log_interval": r.train.logging_steps,
                 "tensorboard_dir": str(run_dir / "tensorboard") if lg.tensorboard else None}
    if lg.wandb is not None and lg.wandb.mode != "disabled":
        out.update(wandb_project=lg.wandb.project, wandb_entity=lg.wandb.entity,
                   wandb_exp_name=lg.wandb.name or run_dir.name, wandb_save_dir=str(run_dir / "wandb"))
    if lg.mlflow is not None:
        out.update(mlflow_experiment=lg.mlflow.experiment, mlflow_tracking_uri=lg.mlflow.tracking_uri)
    return out


def _lora(recipe: Recipe) -> dict[str, Any] | None:
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
