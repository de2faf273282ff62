"""The training loop of a trainer stage: the trainer's run (resumed when asked), a stop on a signal, and
one evaluation at the end when the last step did not evaluate already."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.stages.telemetry import Telemetry


def train_and_evaluate(trainer: Trainer, *, resume_from: str | None, has_eval: bool,
                       telemetry: Telemetry) -> dict[str, Any]:
    """Run `trainer` (from the checkpoint `resume_from`, if any), then evaluate once at the end when it
    has eval data; the tracker runs on `telemetry` end either way."""
    from recipeforge.stages.preemption import raise_if_stopped

    failed = True
    try:
        result = trainer.train(resume_from_checkpoint=resume_from)
        failed = False
        raise_if_stopped(trainer)  # stopped on a signal: checkpoint saved, no final evaluation
        metrics = dict(result.metrics)
        if has_eval and not evaluated_at(trainer, trainer.state.global_step):
            metrics.update(trainer.evaluate())
    finally:
        # Tracker runs end here, before the final save and the end of the process group (a W&B run
        # left to the interpreter's exit would be torn down after the group is gone).
        telemetry.close_trackers(failed=failed)
    return metrics


def evaluated_at(trainer: Trainer, step: int) -> bool:
    """Whether `trainer` logged eval metrics at `step` (the final evaluation is then not repeated)."""
    return any(h.get("step") == step and any(k.startswith("eval_") for k in h)
               for h in trainer.state.log_history)
