"""The warmup-stable-decay learning-rate schedule (`train.scheduler: wsd`), defined once.

One definition for every backend: linear warmup over the warmup steps, the peak rate held constant,
then a cosine decay to zero over the last `train.decay_ratio` share of all optimizer steps. The share
is taken of the real number of optimizer steps, whether the recipe gives `max_steps` or `epochs`:

- `wsd_phases` splits a number of steps into the three phases (pure; the Megatron configuration and
  the tests use it too),
- `wsd_factor` is the multiplier of the peak rate at a step (the same formula as transformers'
  `get_wsd_schedule`, so a trainer's scheduler and this module agree step by step),
- `wsd_callback` makes a transformers/TRL trainer follow it. The trainer creates its scheduler when
  training starts, with the total number of optimizer steps it computed from the data, epochs,
  batch size and accumulation; the callback then sets the phases from that same total (the
  trainer's state holds it), before the first step.

Nothing here imports torch or transformers at module level.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

DECAY_TYPE = "cosine"


@dataclass(frozen=True)
class WSDPhases:
    """Optimizer steps in each phase; they add up to the total."""

    warmup: int
    stable: int
    decay: int

    @property
    def total(self) -> int:
        return self.warmup + self.stable + self.decay

    @property
    def decay_start(self) -> int:
        """The first step of the decay phase (it still runs at the peak: the decay starts there)."""
        return self.warmup + self.stable


def wsd_phases(total_steps: int, warmup_steps: int, decay_ratio: float) -> WSDPhases:
    """Split `total_steps` into warmup, stable and decay steps.

    Decay: `decay_ratio` of the total, rounded to the nearest step, at least one step when the ratio
    is above zero. Warmup comes first and is never cut; when warmup and decay do not both fit, the
    decay gets what is left and the stable phase is empty.
    """
    if not 0.0 <= decay_ratio <= 1.0:
        raise ValueError(f"decay_ratio must be within [0, 1], got {decay_ratio}")
    total = max(int(total_steps), 0)
    warmup = min(max(int(warmup_steps), 0), total)
    decay = int(math.floor(decay_ratio * total + 0.5))
    if decay_ratio > 0 and total > 0:
        decay = max(decay, 1)
    decay = min(decay, total - warmup)
    return WSDPhases(warmup=warmup, stable=total - warmup - decay, decay=decay)


def wsd_factor(step: int, phases: WSDPhases, decay_type: str = DECAY_TYPE, min_lr_ratio: float = 0.0) -> float:
    """The learning rate at optimizer step `step` (0 = the first step) as a share of the peak."""
    if step < phases.warmup:
        factor = step / max(1, phases.warmup)
    elif step < phases.decay_start:
        return 1.0
    elif step < phases.total:
        progress = (step - phases.decay_start) / max(1, phases.decay)
        if decay_type == "cosine":
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        elif decay_type == "linear":
            factor = 1.0 - progress
        else:
            raise ValueError(f"unknown decay type {decay_type!r}")
    else:
        return min_lr_ratio
    return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)


def wsd_callback(decay_ratio: float, decay_type: str = DECAY_TYPE):
    """A TrainerCallback that gives the trainer's scheduler the WSD phases of the run's real length."""
    from transformers import TrainerCallback

    class WSDSchedule(TrainerCallback):
        """Sets the warmup/stable/decay phases once the trainer knows its number of optimizer steps."""

        def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
            total = int(state.max_steps)
            phases = wsd_phases(total, args.get_warmup_steps(total), decay_ratio)
            set_schedule(lr_scheduler, functools.partial(wsd_factor, phases=phases, decay_type=decay_type))
            self.phases = phases

    return WSDSchedule()


def set_schedule(lr_scheduler, factor) -> None:
    """Make a `LambdaLR` (the trainer's scheduler, possibly wrapped by accelerate) follow `factor`.

    Runs before the first optimizer step of the run (or of a resumed run, after the scheduler's
    saved state was loaded); the rate of the current step is set right away.
    """
    from torch.optim.lr_scheduler import LambdaLR

    inner = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's AcceleratedScheduler
    if not isinstance(inner, LambdaLR):
        # Another scheduler (a DeepSpeed config's own, say) would silently ignore the schedule.
        raise RuntimeError(f"scheduler wsd needs the trainer's LambdaLR scheduler, found {type(inner).__name__}")
    inner.lr_lambdas = [factor] * len(inner.optimizer.param_groups)
    for group, base_lr in zip(inner.optimizer.param_groups, inner.base_lrs):
        group["lr"] = base_lr * factor(inner.last_epoch)
