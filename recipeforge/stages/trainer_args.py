"""The recipe and the plan as trainer arguments: one pure function, no library imported.

`trainer_arguments` maps a recipe and its plan to the keyword arguments of transformers'
`TrainingArguments` (and of TRL's configs, which extend it). It reads numbers and names only, so it
is tested without importing transformers; the runner adds the stage's own fields and the backend's
on top (`stages.base.TrainerStage.training_arguments`, the one place they are merged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipeforge.config.schema.output import OutputConfig
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.train import TrainConfig
    from recipeforge.plan.types import Plan

# recipe `train.optimizer` -> the Trainer's `optim` name
OPTIMIZERS = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit",
              "paged_adamw_8bit": "paged_adamw_8bit", "paged_adamw_32bit": "paged_adamw_32bit",
              "adafactor": "adafactor", "sgd": "sgd", "lion_8bit": "lion_8bit",
              # torchao's low-bit AdamW through the Trainer's own optimizer names
              "adamw_torchao_8bit": "adamw_torch_8bit", "adamw_torchao_4bit": "adamw_torch_4bit"}
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "lion_8bit")
# recipe `train.scheduler` -> (the Trainer's `lr_scheduler_type`, its `lr_scheduler_kwargs`)
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    "linear": ("linear", {}), "cosine": ("cosine", {}),
    "cosine_with_min_lr": ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    "constant": ("constant", {}), "constant_with_warmup": ("constant_with_warmup", {}),
    # wsd: the phases depend on the run's real number of steps, which the trainer knows only when
    # training starts: `components.schedules.wsd_callback` sets them then.
    "wsd": ("warmup_stable_decay", {"decay_type": "cosine", "num_decay_steps": 0})}
# transformers 5 renamed the switch; the old name still works there, with a warning.
CHECKPOINTING_FIELD = "activation_checkpointing"
OLD_CHECKPOINTING_FIELD = "gradient_checkpointing"


@dataclass(frozen=True)
class RunFacts:
    """What the arguments need beyond the recipe and the plan, found by the runner at run time."""

    output_dir: str                   # the run's checkpoints folder
    compute_dtype: str                # "bf16", "fp16" or "fp32": `model.dtype` resolved for the device
    has_eval: bool = False            # whether the data has an evaluation split
    run_name: str | None = None       # the name trackers and training_args.bin get
    tf32: bool | None = None          # `train.tf32` resolved for the device (None: torch's default)
    checkpointing_field: str = CHECKPOINTING_FIELD  # the installed transformers' name for it


def trainer_arguments(recipe: Recipe, plan: Plan, facts: RunFacts) -> dict[str, Any]:
    """`TrainingArguments` keyword arguments for `recipe` (`config.Recipe`) run as `plan`
    (`plan.types.Plan`). Pure: the same inputs give the same dict, and nothing is imported."""
    t, o = recipe.train, recipe.output
    scheduler, sched_kwargs = SCHEDULERS[t.scheduler]
    on_cpu = plan.device != "cuda"
    return {
        **_batching(plan, t),
        "learning_rate": t.learning_rate,
        "lr_scheduler_type": scheduler,
        "lr_scheduler_kwargs": sched_kwargs or None,
        "warmup_steps": t.warmup_steps if t.warmup_steps is not None else min(t.warmup_ratio, 0.999),
        "weight_decay": t.weight_decay,
        "adam_beta1": t.adam_beta1,
        "adam_beta2": t.adam_beta2,
        "max_grad_norm": t.max_grad_norm or 0.0,
        "optim": OPTIMIZERS[t.optimizer],
        "seed": t.seed,
        "data_seed": t.seed,
        **_logging_and_saving(t, o, facts),
        "use_cpu": on_cpu,
        # Mixed precision only on GPUs; TRL configs default bf16=True, which CPUs refuse.
        "bf16": not on_cpu and facts.compute_dtype == "bf16",
        "fp16": not on_cpu and facts.compute_dtype == "fp16",
        "tf32": facts.tf32,
        # The same bound on collective waits as the process group (accelerate would otherwise
        # initialise one with its own default when it starts the group itself).
        "ddp_timeout": max(1, math.ceil(recipe.distributed.timeout_minutes * 60)),
        "dataloader_num_workers": 0,
        "train_sampling_strategy": "random" if recipe.data.shuffle else "sequential",
        "push_to_hub": False,
        # Selective and every-N-th-layer checkpointing are enabled on the model by the runner
        # (`stages.checkpointing`); the Trainer's switch covers plain checkpointing of every layer.
        facts.checkpointing_field: bool(plan.gradient_checkpointing) and not runner_checkpoints(plan),
    }


def runner_checkpoints(plan: Plan) -> bool:
    """Whether the plan's checkpointing is one the runner enables itself (selective, or every N-th layer)."""
    return bool(plan.gradient_checkpointing) and (plan.checkpoint_mode != "full" or plan.checkpoint_every > 1)


def _batching(plan: Plan, t: TrainConfig) -> dict[str, Any]:
    """Batch sizes from the plan, the length of the run from the recipe."""
    return {"per_device_train_batch_size": plan.micro_batch_size,
            "per_device_eval_batch_size": plan.micro_batch_size,
            "gradient_accumulation_steps": plan.gradient_accumulation,
            "num_train_epochs": t.epochs or 1.0,
            "max_steps": t.max_steps or -1}


def _logging_and_saving(t: TrainConfig, o: OutputConfig, facts: RunFacts) -> dict[str, Any]:
    """Logging, evaluation and checkpoint settings."""
    return {
        "output_dir": facts.output_dir,
        "logging_steps": t.logging_steps,
        "logging_first_step": True,
        "logging_nan_inf_filter": False,  # a NaN loss must show (and stop the run), not be averaged away
        "eval_strategy": ("steps" if t.eval_steps else "epoch") if facts.has_eval else "no",
        "eval_steps": t.eval_steps,
        "save_strategy": "steps" if o.save_steps else "epoch",
        "save_steps": o.save_steps or 500,
        "save_total_limit": o.save_total_limit,
        "load_best_model_at_end": t.load_best_model_at_end,
        "metric_for_best_model": t.metric_for_best_model if t.load_best_model_at_end else None,
        # Trackers are recipeforge's callbacks (`outputs.trackers`): the trainer never starts one by
        # itself, whatever is installed.
        "report_to": "none",
        "run_name": facts.run_name,
        "disable_tqdm": True,  # the progress line of `outputs.console` replaces the trainer's bar
    }
