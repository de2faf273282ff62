"""Noticing a run that diverges: NaN/inf losses stop it, sustained loss spikes are reported.

One `TrainerCallback` serves every stage. It reads what the trainer logs (the loss is averaged over
all processes before it is logged, so every rank sees the same values and stops together):

- a NaN or infinite ``loss`` or ``grad_norm`` raises `Diverged` (a user error, exit 2) at once. The
  Trainer logs before it saves, so the step that showed the NaN is never checkpointed, and final/ is
  written only after training returns, so it is not written either;
- before each checkpoint and at the end of training the weights themselves are checked, so a NaN
  that arose between two logs is not saved;
- a loss above ``spike_factor`` x the median of the last ``spike_window`` logged losses for
  ``spike_patience`` logs in a row is a spike: a warning with the step (or a stop, `on_spike: stop`).
  Only positive losses have a meaningful ratio to their median: GRPO's loss (near 0, either sign) is
  exempt, and a window holding a non-positive loss is skipped.

`RECIPEFORGE_FAULT=nan:<step>` turns one weight matrix into NaNs right after optimizer step <step>
(once its checkpoint, if any, is written), so the whole path (the NaN loss of the next step, the stop,
what is kept) is tested on a real run.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.stage_specs import stage_spec
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    import torch
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from recipeforge.config.schema.train import DivergenceConfig

HINT = ("lower train.learning_rate, keep gradient clipping on (train.max_grad_norm, e.g. 1.0) or add warmup "
        "(train.warmup_ratio)")


class Diverged(RecipeError):
    """Training diverged (NaN/inf, or a loss spike with `on_spike: stop`); a user error."""


def finite(value: Any) -> bool:
    """Whether a logged value is a finite number (non-numbers count as finite: nothing to judge)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


class SpikeWatch:
    """The spike rule on a stream of logged losses, without any trainer (unit-testable)."""

    def __init__(self, factor: float | None, window: int, patience: int):
        self.factor, self.window, self.patience = factor, window, patience
        self.history: list[float] = []
        self.streak = 0

    def add(self, value: float) -> float | None:
        """Record `value`; returns the running median when this completes a sustained spike.

        Spiking values stay out of the history, so a spike never becomes its own baseline."""
        recent = self.history[-self.window:]
        if self.factor is None or not recent or min(recent) <= 0 or value <= 0:
            self.streak = 0
            self.history.append(value)
            return None
        median = statistics.median(recent)
        if value > self.factor * median:
            self.streak += 1
        else:
            self.streak = 0
            self.history.append(value)
        return median if self.streak == self.patience else None


def make_callback(config: DivergenceConfig, *, stage: str, checkpoints: Path,
                  log: Callable[[str], None]) -> TrainerCallback:
    """The divergence `TrainerCallback` for `config` (a `train.divergence` section)."""
    from transformers import TrainerCallback

    spike_factor = None if stage_spec(stage).rollout else config.spike_factor
    nan_step = _nan_fault_step()  # read once here, not on every step

    class DivergenceCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here (`Any`)
        def __init__(self) -> None:
            self.watch = SpikeWatch(spike_factor, config.spike_window, config.spike_patience)

        def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   logs: dict[str, float] | None = None, **kwargs: Any) -> None:
            if not logs or any(k.startswith("eval_") for k in logs) or "train_runtime" in logs:
                return
            step = state.global_step
            if config.stop_on_nan:
                for key in ("loss", "grad_norm"):
                    if key in logs and not finite(logs[key]):
                        raise Diverged(f"training diverged: {key} is {float(logs[key])} at step {step}; "
                                       f"{_kept(checkpoints)}", key="train.learning_rate", hint=HINT)
            loss = logs.get("loss")
            if loss is None or not finite(loss):
                return
            median = self.watch.add(float(loss))
            if median is None:
                return
            what = (f"loss {float(loss):.4g} at step {step} has stayed above {config.spike_factor:g} x the running "
                    f"median ({median:.4g}) for {config.spike_patience} logs")
            if config.on_spike == "stop":
                raise Diverged(f"training diverged: {what}; {_kept(checkpoints)}", key="train.divergence.on_spike",
                               hint=HINT)
            if state.is_world_process_zero:
                log(f"warning: {what}: the run may be diverging ({HINT}; train.divergence.on_spike: stop ends "
                    f"such runs)")

        def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          model: torch.nn.Module | None = None, **kwargs: Any) -> None:
            if nan_step is not None and nan_step == state.global_step and model is not None:
                _poison(model)

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        model: torch.nn.Module | None = None, **kwargs: Any) -> None:
            if control.should_save and config.stop_on_nan:
                _check_weights(model, state.global_step, checkpoints, before=f"checkpoint-{state.global_step}")

        def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                         model: torch.nn.Module | None = None, **kwargs: Any) -> None:
            if config.stop_on_nan:
                _check_weights(model, state.global_step, checkpoints, before="final/")

    return DivergenceCallback()


def _nan_fault_step() -> int | None:
    from recipeforge.settings import current

    point, _, step = current().fault.partition(":")
    return int(step) if point == "nan" and step.isdecimal() else None


def _poison(model: torch.nn.Module) -> None:
    """Fill the largest trained weight with NaN (the `nan` fault point)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point() and p.numel()]
    if params:
        with torch.no_grad():
            max(params, key=lambda p: p.numel()).fill_(float("nan"))


def _kept(checkpoints: Path) -> str:
    """What is left to continue from, for the message."""
    from recipeforge.outputs.checkpoint import newest_complete

    last = newest_complete(checkpoints)
    kept = (f"the last complete checkpoint is kept (checkpoints/{last.name}): change the recipe and rerun with "
            f"--force to continue from it" if last is not None else "no checkpoint had been saved yet")
    return f"stopped without saving the diverged weights; {kept}"


def _check_weights(model: torch.nn.Module | None, step: int, checkpoints: Path, *, before: str) -> None:
    """Raise `Diverged` when any weight is NaN/inf (agreed over all processes, so all stop together)."""
    if model is None:
        return
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        # This process's part of each trained weight (sharded weights: its shard), one device sync in all.
        # Frozen weights are left out: training cannot have broken them, and quantized ones (bitsandbytes
        # Params4bit) are packed bytes that only look like floats.
        local = [getattr(p, "to_local", lambda p=p: p)() for p in model.parameters()
                 if p.requires_grad and p.is_floating_point()]
        flags = [(~torch.isfinite(t)).any().to(device) for t in local if t.numel()]
        bad = torch.stack(flags).any().float() if flags else torch.zeros((), device=device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        from recipeforge.stages.preemption import collective_device

        bad = bad.to(collective_device())  # NCCL refuses CPU tensors; the first weight may be on the CPU
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    if bad.item() > 0:
        raise Diverged(f"training diverged: the weights hold NaN or infinite values at step {step}, so {before} "
                       f"was not written; {_kept(checkpoints)}", key="train.learning_rate", hint=HINT)
