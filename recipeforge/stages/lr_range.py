"""The learning-rate range test (`recipeforge tune lr`): the rates, the smoothed loss, the divergence
stop, the suggested rate, the trainer callback that drives it, and its files (lr_range.json, lr_range.png).

The test trains from a low to a high rate, exponentially, one rate per optimizer step. The callback sets
every parameter group's rate before each step, so the recipe's scheduler and warmup play no part. The
loss is smoothed as fastai's finder does (an exponential moving average, beta 0.98, bias-corrected);
the test stops once the smoothed loss exceeds `DIVERGE_FACTOR` times the best seen (or is not finite).

The suggestion is fastai's "steep" rule: the rate where the smoothed loss falls fastest, i.e. the most
negative slope of smoothed loss against log10(rate), over the points before divergence. It names the
rate at which training still makes the most progress per step, before the loss turns up; the "valley"
rule picks a point further along the longest descent and tends to land closer to the cliff.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

BETA = 0.98
DIVERGE_FACTOR = 4.0
RULE = "steep"
RULE_TEXT = "steepest descent of the smoothed loss against log10(rate), before divergence (fastai's 'steep')"
JSON_NAME = "lr_range.json"
PNG_NAME = "lr_range.png"
MIN_STEPS = 10


def rates(start: float, end: float, steps: int) -> list[float]:
    """`steps` rates from `start` to `end`, evenly spaced in log scale (both ends included)."""
    ratio = end / start
    return [start * ratio ** (i / (steps - 1)) for i in range(steps)]


def smooth(losses: list[float], beta: float = BETA) -> list[float]:
    """The exponential moving average of `losses`, bias-corrected (fastai's `SmoothenValue`)."""
    out, avg = [], 0.0
    for i, loss in enumerate(losses, start=1):
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta ** i))
    return out


def diverged(smoothed: float, best: float, factor: float = DIVERGE_FACTOR) -> bool:
    """Whether the smoothed loss has gone off: not finite, or above `factor` times the best seen."""
    return not math.isfinite(smoothed) or smoothed > factor * best


def suggest(lrs: list[float], smoothed: list[float]) -> tuple[float, int] | None:
    """The steep rule: (rate, index) of the most negative slope of `smoothed` against log10(rate),
    skipping the first tenth of the points (the average settles there); None with fewer than 3 points."""
    n = len(smoothed)
    if n < 3:
        return None
    x = [math.log10(lr) for lr in lrs[:n]]
    slopes = []
    for i in range(n):  # central differences inside, one-sided at the ends (as numpy.gradient)
        lo, hi = max(i - 1, 0), min(i + 1, n - 1)
        slopes.append((smoothed[hi] - smoothed[lo]) / (x[hi] - x[lo]))
    skip = min(max(1, n // 10), n - 2)
    best = min(range(skip, n), key=lambda i: slopes[i])
    return lrs[best], best


@dataclass
class RangeResult:
    """What the test saw: the rates tried, the losses logged, their smoothed values, and the outcome."""

    start: float
    end: float
    steps: int
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    diverged_at: float | None = None  # the rate at which the smoothed loss left 4x the best
    suggestion: float | None = None
    rule: str = RULE

    def add(self, lr: float, loss: float) -> bool:
        """Record one step; True when the test has diverged (the trainer should stop)."""
        self.lrs.append(lr)
        self.losses.append(loss)
        self.smoothed = smooth(self.losses)
        finite = [s for s in self.smoothed[:-1] if math.isfinite(s)]
        best = min(finite) if finite else self.smoothed[-1]
        if len(self.smoothed) > 1 and diverged(self.smoothed[-1], best):
            self.diverged_at = lr
            return True
        return False

    def finish(self) -> None:
        """Pick the suggestion from the points before divergence (the diverged one left out)."""
        n = len(self.smoothed) - (1 if self.diverged_at is not None else 0)
        found = suggest(self.lrs[:n], self.smoothed[:n])
        self.suggestion = found[0] if found else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rule_text"] = RULE_TEXT
        data["losses"] = [x if math.isfinite(x) else None for x in self.losses]
        data["smoothed"] = [x if math.isfinite(x) else None for x in self.smoothed]
        return data


def make_callbacks(result: RangeResult, log: Callable[[str], None]) -> tuple[TrainerCallback, TrainerCallback]:
    """The two `TrainerCallback`s running the test. The first goes before every other callback: each
    step's rate into every parameter group before the step, the step's loss into `result` (and its rate
    into the logged record the console and metrics.jsonl show), training stopped at divergence. The
    second goes after the trainer's own flow callback: no checkpoint and no evaluation during the test."""
    from transformers import TrainerCallback

    schedule = rates(result.start, result.end, result.steps)

    class LRRangeCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here (`Any`)
        def rate(self, step: int) -> float:
            return schedule[min(step, len(schedule) - 1)]

        def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
            if optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = self.rate(state.global_step)

        def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   logs: dict[str, float] | None = None, **kwargs: Any) -> None:
            if not logs or "loss" not in logs or any(k.startswith("eval_") for k in logs):
                return
            lr = self.rate(state.global_step - 1)  # the step just taken
            logs["learning_rate"] = lr  # metrics.jsonl shows the rate the step ran at, not the scheduler's
            if result.add(lr, float(logs["loss"])):
                log(f"lr range: the smoothed loss passed {DIVERGE_FACTOR:g}x its best at rate {lr:.3g} "
                    f"(step {state.global_step}); stopping")
                control.should_training_stop = True

    class NoSaveCallback(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> None:
            control.should_save = False  # the test's weights are thrown away (also at its last step)
            control.should_evaluate = False

    return LRRangeCallback(), NoSaveCallback()


def write_files(result: RangeResult, run_root: Path, log: Callable[[str], None]) -> tuple[Path, Path | None]:
    """lr_range.json, and lr_range.png when matplotlib is installed (else one log line saying so)."""
    run_root = Path(run_root)
    json_path = run_root / JSON_NAME
    json_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"{PNG_NAME} not written: matplotlib is not installed (pip install 'recipeforge[report]'); "
            f"the curve is in {json_path}")
        return json_path, None
    return json_path, draw(result, run_root / PNG_NAME)


def draw(result: RangeResult, path: Path) -> Path:
    """The curve as a PNG: raw and smoothed loss against the rate (log axis), the suggestion marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(result.lrs, result.losses, color="C0", alpha=0.35, label="loss")
    ax.plot(result.lrs, result.smoothed, color="C0", label=f"smoothed (beta {BETA})")
    if result.suggestion is not None:
        ax.axvline(result.suggestion, color="C3", linestyle="--", label=f"suggested {result.suggestion:.2e} ({RULE})")
    finite = [s for s in result.smoothed if math.isfinite(s)]
    if finite:  # the diverging tail would flatten the rest of the curve
        low = min(finite)
        ax.set_ylim(low - 0.05 * abs(low), min(max(finite), DIVERGE_FACTOR * low) * 1.05)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("learning-rate range test")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    import os

    tmp = path.with_name(f".{path.name}.tmp")  # written aside, then moved: a reader never sees half a file
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
