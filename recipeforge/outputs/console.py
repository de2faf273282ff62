"""What a training run prints: one progress line, and the token count behind its speed.

The progress line (main process only) shows ``step N/TOTAL``, the last logged loss, tokens per second
and the time left. On a terminal it is rewritten in place; otherwise (a log file, a CI job, a Slurm
output) it is printed as a plain line for the first step, then at most every `settings.PROGRESS_INTERVAL` seconds,
and for the last step. Library noise is kept off the console by `outputs.library_warnings`;
``--verbose`` or ``RECIPEFORGE_VERBOSE=1`` leaves everything on the console.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from recipeforge.settings import VERBOSE_ENV as VERBOSE_ENV
from recipeforge.settings import current


def verbose() -> bool:
    """Whether the user asked to see everything on the console (``--verbose``)."""
    return current().verbose


# -- progress line ----------------------------------------------------------------------------------

def format_progress(step: int, total: int, loss: float | None, tokens_per_second: float | None,
                    eta_seconds: float | None) -> str:
    """``step 12/80 | loss 3.214 | 1,530 tok/s | ETA 0:01:02`` (unknown fields shown as ``-``)."""
    width = len(str(total)) if total > 0 else 1
    parts = [f"step {step:>{width}}/{total if total > 0 else '?'}",
             f"loss {loss:.4f}" if loss is not None else "loss -",
             f"{tokens_per_second:,.0f} tok/s" if tokens_per_second is not None else "- tok/s",
             f"ETA {_clock(eta_seconds)}" if eta_seconds is not None else "ETA -"]
    return " | ".join(parts)


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """The progress state of one training call; `line()` renders it. Tokens come from the trainer's
    logs when it counts them (TRL's ``num_tokens``, transformers' ``num_input_tokens_seen``: cumulative
    over all ranks), else from `TokenCount` (this rank's batches times the data-parallel size)."""

    def __init__(self, total: int, start_step: int = 0, clock=time.monotonic):
        self.total = total
        self.clock = clock
        self.started = clock()
        self.start_step = start_step
        self.step = start_step
        self.loss: float | None = None
        self.tokens_per_second: float | None = None
        self._tokens_at: tuple[float, float] | None = None  # (time, tokens) of the first count seen

    def update_step(self, step: int) -> None:
        self.step = step

    def update_log(self, logs: dict, counted: float | None = None) -> None:
        if isinstance(logs.get("loss"), (int, float)):
            self.loss = float(logs["loss"])
        tokens = logs.get("num_input_tokens_seen", logs.get("num_tokens"))
        # The trainer's count covers all steps (a resumed run's earlier ones too); ours this call's.
        per_step_share = 1.0
        if not isinstance(tokens, (int, float)):
            tokens = counted or None
        elif self.step > 0:
            per_step_share = (self.step - self.start_step) / self.step
        if not tokens:
            return
        now = self.clock()
        if self._tokens_at is not None and now > self._tokens_at[0]:
            # Since the previous record: the current speed, not the average since the start.
            self.tokens_per_second = (tokens - self._tokens_at[1]) / (now - self._tokens_at[0])
        elif now > self.started:
            self.tokens_per_second = tokens * per_step_share / (now - self.started)
        self._tokens_at = (now, float(tokens))

    def eta(self) -> float | None:
        done = self.step - self.start_step
        if done <= 0 or self.total <= 0:
            return None
        return (self.clock() - self.started) / done * max(self.total - self.step, 0)

    def line(self) -> str:
        return format_progress(self.step, self.total, self.loss, self.tokens_per_second, self.eta())


class TokenCount:
    """Wraps a data collator to count the tokens of the training batches this process builds (the
    attention mask's ones, else every input id); evaluation batches are not counted."""

    def __init__(self, collator, data_parallel: int = 1):
        self.collator = collator
        self.data_parallel = max(1, data_parallel)
        self.tokens = 0
        self.paused = False

    def __call__(self, features):
        batch = self.collator(features)
        if not self.paused:
            # The rows' own token ids before padding (packed rows have no attention mask to count);
            # preference rows count every `*input_ids` field (prompt, chosen, rejected).
            counted = _row_tokens(features)
            if counted is None and hasattr(batch, "get"):
                mask, ids = batch.get("attention_mask"), batch.get("input_ids")
                if mask is not None and hasattr(mask, "sum"):
                    counted = int(mask.sum())
                elif ids is not None and hasattr(ids, "numel"):
                    counted = int(ids.numel())
            self.tokens += counted or 0
        return batch

    def __getattr__(self, name):  # the trainer asks collators for attributes of their own
        if name == "collator":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.collator, name)

    def total(self) -> float:
        """Tokens of the whole job so far (every data-parallel rank builds batches like this one)."""
        return float(self.tokens * self.data_parallel)


def _row_tokens(features) -> int | None:
    """Tokens of a batch's rows from their `*input_ids` fields, or None when rows carry none."""
    if not isinstance(features, (list, tuple)) or not features or not isinstance(features[0], dict):
        return None
    keys = [k for k in features[0] if k.endswith("input_ids")]
    if not keys:
        return None
    return sum(len(row[k]) for row in features for k in keys if hasattr(row.get(k), "__len__"))


class TokenRate:
    """A metrics log source: the job's trained tokens so far (`num_tokens`) and tokens per second
    since the previous training record, from the `TokenCount` set once the trainer is built."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.counter: TokenCount | None = None
        self.clock = clock
        self._last: tuple[float, float] | None = None

    def __call__(self) -> dict:
        if self.counter is None or not self.counter.tokens:
            return {}
        now, total = self.clock(), self.counter.total()
        out = {"num_tokens": total}
        if self._last is not None and now > self._last[0]:
            out["tokens_per_second"] = round((total - self._last[1]) / (now - self._last[0]), 1)
        self._last = (now, total)
        return out


def attach_token_counter(trainer, data_parallel: int = 1) -> TokenCount | None:
    """Count the tokens of the training batches the trainer builds (its collator wrapped), pausing
    while it evaluates; None for a trainer without a collator of its own."""
    if trainer is None or getattr(trainer, "data_collator", None) is None:
        return None
    if isinstance(trainer.data_collator, TokenCount):
        return trainer.data_collator
    from transformers import TrainerCallback

    counter = trainer.data_collator = TokenCount(trainer.data_collator, data_parallel)

    class PauseForEvaluation(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if control.should_evaluate:
                counter.paused = True  # evaluation batches follow: not training tokens

        def on_evaluate(self, args, state, control, **kwargs):
            counter.paused = False

    trainer.add_callback(PauseForEvaluation())
    return counter


def progress_callback(stream: TextIO | None = None, *, tty: bool | None = None,
                      interval: float | None = None, counter: TokenCount | None = None):
    """A `TrainerCallback` printing the progress line to `stream` (stderr)."""
    from transformers import TrainerCallback

    out = stream or sys.stderr
    in_place = out.isatty() if tty is None else tty
    every = interval if interval is not None else current().progress_interval

    class ProgressLine(TrainerCallback):
        def __init__(self):
            self.progress: Progress | None = None
            self.last_print = 0.0
            self.printed_step = -1

        def on_train_begin(self, args, state, control, **kwargs):
            self.progress = Progress(state.max_steps, start_step=state.global_step)
            self.printed_step = -1

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update_step(state.global_step)
                if in_place:
                    self._show(min_gap=0.2)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.progress is None or not logs or not state.is_world_process_zero:
                return
            self.progress.update_step(state.global_step)
            self.progress.update_log(logs, counter.total() if counter is not None else None)
            if self.printed_step == state.global_step and not in_place:
                return  # the summary record after the last step: that step is shown already
            if in_place or self.printed_step < 0 or state.global_step >= state.max_steps \
                    or time.monotonic() - self.last_print >= every:
                self._show(min_gap=0.0)

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is None:
                return
            if self.printed_step != state.global_step:
                self.progress.update_step(state.global_step)
                self._show(min_gap=0.0)
            if in_place:
                out.write("\n")
                out.flush()
            self.progress = None

        def _show(self, *, min_gap: float) -> None:
            now = time.monotonic()
            if now - self.last_print < min_gap:
                return
            self.last_print, self.printed_step = now, self.progress.step
            text = f"[recipeforge] {self.progress.line()}"
            out.write(f"\r\x1b[2K{text}" if in_place else text + "\n")
            out.flush()

    return ProgressLine()


def attach_progress(trainer, *, enabled: bool, data_parallel: int = 1) -> None:
    """Replace the trainer's console output (tqdm bar, or the printed log dictionaries) by the
    progress line; with `enabled` false (other ranks, ``logging.progress_bar: false``) keep the
    trainer's plain printing."""
    if not enabled or trainer is None:
        return
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    # Batches are built in this process (dataloader_num_workers is 0), so the count is seen here.
    counter = attach_token_counter(trainer, data_parallel)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(progress_callback(counter=counter))
