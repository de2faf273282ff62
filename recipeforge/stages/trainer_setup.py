"""A trainer stage's trainer arguments and what its trainer gets once built: the arguments every
stage shares with the stage's own and the backend's merged in one place, the optimizer of a pure-bf16
or in-backward step, the backend's completion of a model loaded sharded, activation offloading, phase
memory, the token counter and the progress line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from recipeforge.errors import RecipeError
from recipeforge.stages.context import StageContext
from recipeforge.stages.trainer_args import RunFacts, runner_checkpoints, trainer_arguments

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Trainer
    from recipeforge.components.kernels import KernelEffects
    from recipeforge.outputs.console import TokenRate

# The class of a stage's trainer arguments (TrainingArguments, a TRL config).
_Arguments = TypeVar("_Arguments")


def common_arguments(ctx: StageContext, *, has_eval: bool, run_name: str | None,
                     kernels: KernelEffects | None) -> dict[str, Any]:
    """The arguments every stage shares (`stages.trainer_args`), plus the kernels' own."""
    from transformers import TrainingArguments

    from recipeforge.components.models import resolve_dtype
    from recipeforge.stages.precision import cuda_capability, tf32_argument
    from recipeforge.stages.trainer_args import CHECKPOINTING_FIELD, OLD_CHECKPOINTING_FIELD

    plan, t = ctx.plan, ctx.recipe.train
    dtype = str(resolve_dtype(ctx.recipe.model.dtype, plan.device))
    facts = RunFacts(
        output_dir=str(ctx.run.checkpoints),
        compute_dtype={"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(dtype, "fp32"),
        has_eval=has_eval, run_name=run_name,
        # TF32 matmuls on Ampere or newer (`train.tf32`); None leaves torch's default
        tf32=tf32_argument(t.tf32, plan.device, cuda_capability() if plan.device == "cuda" else None),
        checkpointing_field=CHECKPOINTING_FIELD if CHECKPOINTING_FIELD in TrainingArguments.__dataclass_fields__
        else OLD_CHECKPOINTING_FIELD)
    kwargs = trainer_arguments(ctx.recipe, plan, facts)
    kwargs.update(kernels.trainer_kwargs if kernels is not None else {})
    return kwargs


def training_arguments(ctx: StageContext, cls: type[_Arguments], common: dict[str, Any],
                       stage_kwargs: dict[str, Any]) -> _Arguments:
    """Build `cls` (TrainingArguments or a TRL config): `common` settings, then the stage's, then the
    backend's — the single place where backend trainer arguments are merged."""
    kwargs = {**common, **stage_kwargs, **ctx.backend_kwargs}
    if ctx.recipe.train.activation_offloading:
        from recipeforge.stages.activation_offload import trainer_field

        kwargs.update(trainer_field(cls))  # TRL's configs; the plain Trainer's step is wrapped instead
    if "pad_to_multiple_of" in getattr(cls, "__dataclass_fields__", {}) and "pad_to_multiple_of" not in kwargs:
        from recipeforge.components.collate import pad_multiple

        kwargs["pad_to_multiple_of"] = pad_multiple(ctx.plan.device)  # TRL configs pad themselves
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a combination the trainer refuses, e.g. batch sizes for GRPO
        raise RecipeError(f"the trainer rejected the settings: {str(exc).splitlines()[0]}") from None


def attach_optimizer(ctx: StageContext, trainer: Trainer) -> None:
    """The optimizer the plan asks for besides the trainer's own: one per parameter stepped in backward
    (`train.optimizer_in_backward`), or torchao's AdamW for pure bf16 with stochastic rounding."""
    from recipeforge.stages.precision import sr_optimizer

    optimizer = sr_optimizer(ctx.plan, ctx.recipe.train)
    if ctx.recipe.train.optimizer_in_backward:  # one optimizer per parameter, stepped in backward
        from recipeforge.components.optim_in_backward import attach

        attach(trainer, optimizer)  # Trainer.create_optimizer keeps an optimizer it was given
    elif optimizer is not None:  # pure bf16 with stochastic rounding: torchao's AdamW
        # Read by Trainer.create_optimizer, which runs when training starts.
        trainer.optimizer_cls_and_kwargs = optimizer


def finish_trainer(ctx: StageContext, trainer: Trainer, token_rate: TokenRate) -> float:
    """What follows the trainer's construction: the backend's completion of a model loaded sharded,
    activation offloading, phase memory, the token counter (into `token_rate`) and the progress line.
    Returns the seconds the backend's completion took (part of loading the model)."""
    from recipeforge.outputs.console import attach_progress, attach_token_counter

    seconds = 0.0
    if ctx.prepare_trainer is not None:
        import time

        started = time.perf_counter()
        ctx.prepare_trainer(trainer)  # a base loaded or made shard by shard gets its values here
        seconds = time.perf_counter() - started
    if ctx.recipe.train.activation_offloading:  # TRL's trainers with the field do it themselves
        from recipeforge.stages.activation_offload import wrap_training_step

        wrap_training_step(trainer)
    from recipeforge.outputs.phase_memory import measure_trainer

    measure_trainer(trainer)  # evaluations and checkpoint saves are phases of their own
    data_parallel = ctx.plan.data_parallel or 1
    token_rate.counter = attach_token_counter(trainer, data_parallel)
    attach_progress(trainer, enabled=ctx.recipe.logging.progress_bar and ctx.dist.is_main,
                    data_parallel=data_parallel)
    return seconds



def enable_runner_checkpointing(ctx: StageContext, model: PreTrainedModel) -> None:
    """Activation checkpointing the runner applies itself (selective, or every N-th layer:
    `stages.checkpointing`) when the plan asks for it; the trainer's own flag covers the rest
    (`stages.trainer_args`)."""
    if runner_checkpoints(ctx.plan):
        from recipeforge.stages.checkpointing import SELECTIVE, enable_checkpointing

        enable_checkpointing(model, selective=ctx.plan.checkpoint_mode == SELECTIVE, every=ctx.plan.checkpoint_every)

def trainer_error(stage: str, trainer_class: str, exc: BaseException) -> RecipeError:
    """The user error for `exc`, raised by the training library while the stage's trainer (or its
    arguments) was built: one line with the library's own message, and which version said it."""
    from importlib import metadata

    library = (trainer_class or "transformers").split(".")[0]
    try:
        version = f"{library} {metadata.version(library)}"
    except metadata.PackageNotFoundError:
        version = library
    said = " ".join(str(exc).split())
    said = said if len(said) <= 400 else said[:397] + "..."
    return RecipeError(f"building the {stage} trainer ({trainer_class or 'trainer'}) failed: "
                       f"{type(exc).__name__}: {said}", key="stage",
                       hint=f"the installed {version} refused the settings this recipe leads to; change the "
                            f"setting it names, or install the version recipeforge supports "
                            f"(--debug shows the traceback)")
