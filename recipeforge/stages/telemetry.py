"""What a trainer run records about itself while it trains, and the callbacks that record it.

A `Telemetry` record holds the run's measuring parts: the sources each training record reads (the
token rate, a stage's own values), and the tracker callbacks (W&B, MLflow) that the runner closes when
training ends. `trainer_callbacks` wires every callback of a run (`stages.callbacks.run_callbacks`,
fp8's per-step scales, the base-model writer of a random-init adapter base) from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.config.secrets import public
from recipeforge.outputs.console import TokenRate

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainerCallback

    from recipeforge.stages.context import RecipeContext, StageContext
    from recipeforge.stages.model_builder import ModelBuilder

LogSource = Callable[[], dict[str, Any]]


@dataclass
class Telemetry:
    """A run's measuring parts: extra values for each training record, tokens/s, and the tracker
    callbacks to close when training ends."""

    log_sources: list[LogSource] = field(default_factory=list)  # a stage appends its own (read when wired)
    token_rate: TokenRate = field(default_factory=TokenRate)  # counts once the trainer is finished
    trackers: list[TrainerCallback] = field(default_factory=list)  # set by `trainer_callbacks`

    def close_trackers(self, *, failed: bool) -> None:
        """End the tracker runs (before the final save and the end of the process group)."""
        from recipeforge.outputs.trackers import close_all

        close_all(self.trackers, failed=failed)


def run_name(ctx: RecipeContext) -> str | None:
    """The run's name for trackers and training_args.bin: never one read from a secret variable."""
    name: str | None = public(ctx.loaded, ("name",), ctx.recipe.name)
    return name or (Path(ctx.loaded.path).stem if ctx.loaded.path else None)


def trainer_callbacks(ctx: StageContext, telemetry: Telemetry, model: PreTrainedModel | None,
                      models: ModelBuilder | None) -> list[TrainerCallback]:
    """Every callback of the run in `ctx`, in the trainer's order; keeps the tracker ones on
    `telemetry` to be closed when training ends."""
    from recipeforge.stages import fp8
    from recipeforge.stages.callbacks import run_callbacks

    wandb = ctx.recipe.logging.wandb
    made = run_callbacks(ctx, log_sources=[*telemetry.log_sources, telemetry.token_rate], run_name=run_name(ctx),
                         wandb_name=public(ctx.loaded, ("logging", "wandb", "name"), wandb.name) if wandb else None)
    telemetry.trackers = made.trackers
    made.all.extend(fp8.callbacks(ctx, model))  # FSDP2 float8 all-gather: scales per step
    base = models.save_callback() if models is not None else None
    # A checkpoint's adapter names base_model/: a random-init base is written with the first one.
    return [*made.all, base] if base is not None else made.all
