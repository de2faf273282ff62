"""Every callback a training run attaches to its trainer, built in one place.

Metrics (metrics.jsonl, with extra sources such as the token rate and peak memory), the warmup-
stable-decay schedule, tensorboard, the divergence watch (`stages.divergence`), the stop on a signal
(`stages.preemption`) and the trackers (`outputs.trackers`). Checkpoints are staged, marked complete
and published by the trainer itself (`outputs.atomic.crash_safe`), not by a callback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from recipeforge.stages.context import StageContext


@dataclass(frozen=True)
class Callbacks:
    """A run's callbacks: all of them in the order the trainer gets them, and the tracker ones apart
    (closed by the runner when training ends, before the process group goes)."""

    all: list[TrainerCallback] = field(default_factory=list)
    trackers: list[TrainerCallback] = field(default_factory=list)


def run_callbacks(ctx: StageContext, *, log_sources: Sequence[Callable[[], dict[str, Any]]],
                  run_name: str | None, wandb_name: str | None) -> Callbacks:
    """The callbacks of a run in `ctx`; `log_sources` add values to each training record."""
    from recipeforge.outputs import metrics
    from recipeforge.outputs.trackers import tracker_callbacks
    from recipeforge.stages.device_memory import peak_memory_source
    from recipeforge.stages.divergence import make_callback as divergence_callback
    from recipeforge.stages.preemption import make_callback as stop_on_signal

    recipe, run, is_main = ctx.recipe, ctx.run, ctx.dist.is_main
    memory = peak_memory_source(ctx.plan.device)
    writer = metrics.MetricsWriter(run.metrics, enabled=is_main)
    cbs: list[TrainerCallback] = [metrics.make_callback(writer, [*log_sources, *([memory] if memory else [])])]
    if recipe.train.scheduler == "wsd":
        from recipeforge.components.schedules import wsd_callback

        cbs.append(wsd_callback(recipe.train.decay_ratio))
    if recipe.logging.tensorboard and is_main:
        cbs.append(tensorboard_callback(run.tensorboard))
    cbs.append(divergence_callback(recipe.train.divergence, stage=recipe.stage, checkpoints=run.checkpoints,
                                   log=ctx.log))
    cbs.append(stop_on_signal(run.checkpoints, ctx.resume_from))  # SIGTERM: save at the step's end, stop
    trackers = tracker_callbacks(recipe, run, run_name=run_name, is_main=is_main,
                                 wandb_name=wandb_name or run.root.name, locate=ctx.locate)
    return Callbacks(all=[*cbs, *trackers], trackers=list(trackers))


def tensorboard_callback(log_dir: Path) -> TrainerCallback:
    """transformers' TensorBoard callback writing to `log_dir`; a `RecipeError` without tensorboard."""
    from transformers.integrations import TensorBoardCallback

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RecipeError("logging.tensorboard needs the tensorboard package, which is not installed",
                          key="logging.tensorboard", hint="pip install 'recipeforge[tensorboard]'") from None
    log_dir.mkdir(parents=True, exist_ok=True)
    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))
