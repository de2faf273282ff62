"""What a training run prints: one progress line, and library noise kept out of the console.

The progress line (main process only) shows ``step N/TOTAL``, the last logged loss, tokens per second
and the time left. On a terminal it is rewritten in place; otherwise (a log file, a CI job, a Slurm
output) it is printed as a plain line for the first step, then at most every `PLAIN_INTERVAL` seconds,
and for the last step.

Python warnings raised inside libraries (transformers' FutureWarnings, TRL's notes) and the warning
records of the libraries' loggers say nothing the user can act on; they go to ``RUN/logs/warnings.log``
instead of the console. Warnings from the user's own code and errors stay on the console, as do
recipeforge's own messages (printed, not warned). ``--verbose`` or ``RECIPEFORGE_VERBOSE=1`` leaves
everything on the console.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import TextIO

VERBOSE_ENV = "RECIPEFORGE_VERBOSE"
PLAIN_INTERVAL_ENV = "RECIPEFORGE_PROGRESS_INTERVAL"
PLAIN_INTERVAL = 30.0  # seconds between plain progress lines
WARNINGS_LOG = Path("logs") / "warnings.log"
# Loggers of the libraries a run drives; their WARNING records go to the warnings log.
# torch.utils._pytree: deprecation notes torch prints when a library (torchao, imported by
# transformers whenever installed) registers its types at import.
LIBRARY_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "torchao",
                   "bitsandbytes", "deepspeed", "torch.utils._pytree")


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


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

    def __init__(self, clock=time.monotonic):
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
    every = interval if interval is not None else float(os.environ.get(PLAIN_INTERVAL_ENV, PLAIN_INTERVAL))

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


# -- library warnings -------------------------------------------------------------------------------

def _library_dirs() -> tuple[str, ...]:
    """Where library code lives: site-packages, the standard library, and recipeforge itself (a
    library's deprecation warning is often attributed to the recipeforge line that called it)."""
    paths = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    paths.add(str(Path(__file__).resolve().parents[1]))
    return tuple(str(Path(p).resolve()) + os.sep for p in paths if p)


class WarningsRouter:
    """Sends library warnings to a log file (lines kept in memory until the run directory is known)."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.path: Path | None = None
        self.pending: list[str] = []
        self.count = 0
        self._dirs = _library_dirs()
        self._showwarning = None
        self._handler: logging.Handler | None = None
        self._loggers: list[tuple[logging.Logger, bool]] = []
        self._transformers_default = False

    # python warnings
    def is_library(self, filename: str) -> bool:
        try:
            resolved = str(Path(filename).resolve())
        except (OSError, ValueError):
            return False
        return resolved.startswith(self._dirs) or filename.startswith("<frozen")

    def _show(self, message, category, filename, lineno, file=None, line=None):
        if not self.is_library(filename):
            return self._showwarning(message, category, filename, lineno, file, line)
        self.write(warnings.formatwarning(message, category, filename, lineno, line).rstrip())

    def write(self, text: str) -> None:
        self.count += 1
        entry = f"[{time.strftime('%H:%M:%S')}]{f' [rank {self.rank}]' if self.rank else ''} {text}\n"
        if self.path is None:
            self.pending.append(entry)
        else:
            self._append(entry)

    def _append(self, entry: str) -> None:
        try:
            # One write per entry with O_APPEND: the ranks of a job share the file.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, entry.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            sys.stderr.write(entry)

    def attach(self, run_root: Path) -> Path:
        """Write to ``run_root/logs/warnings.log`` from now on (with what was held back so far)."""
        path = Path(run_root) / WARNINGS_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        pending, self.pending = self.pending, []
        for entry in pending:
            self._append(entry)
        return path

    def install(self) -> None:
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._show
        if "transformers" in sys.modules:  # else when the run directory is known (`to_run_dir`):
            self.quiet_transformers()      # a dry run or `plan` must not import transformers
        router = self

        class ToLog(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.ERROR:  # errors stay on the console
                    sys.stderr.write(self.format(record) + "\n")
                else:
                    router.write(self.format(record))

        self._handler = ToLog(logging.WARNING)
        self._handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            self._loggers.append((logger, logger.propagate))
            logger.addHandler(self._handler)
            logger.propagate = False

    def quiet_transformers(self) -> None:
        """Remove transformers' own stderr handler (ours replaces it); imports transformers."""
        if self._transformers_default:
            return
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            return
        hf_logging.disable_default_handler()
        # Its own tqdm bars too ("Writing model shards", "Loading weights"): the progress line is the
        # run's one bar.
        self._progress_bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        self._transformers_default = True

    def uninstall(self) -> None:
        if self._showwarning is not None:
            warnings.showwarning = self._showwarning
            self._showwarning = None
        for logger, propagate in self._loggers:
            logger.removeHandler(self._handler)
            logger.propagate = propagate
        self._loggers.clear()
        if self._transformers_default:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_default_handler()
            if getattr(self, "_progress_bars", False):
                hf_logging.enable_progress_bar()
            self._transformers_default = False


_ROUTER: WarningsRouter | None = None


def route_library_warnings(rank: int = 0) -> WarningsRouter | None:
    """Start keeping library warnings off the console (nothing with ``--verbose``); returns the router
    (already installed: the same one)."""
    global _ROUTER
    if verbose():
        return None
    if _ROUTER is None:
        _ROUTER = WarningsRouter(rank)
        _ROUTER.install()
    return _ROUTER


def warnings_to_run_dir(run_root: Path) -> Path | None:
    """From now on, library warnings of this process go to ``run_root/logs/warnings.log``."""
    if _ROUTER is None:
        return None
    _ROUTER.quiet_transformers()  # training follows: transformers is about to be imported anyway
    return _ROUTER.attach(run_root)


def stop_routing(log=None) -> None:
    """Put the console back as it was; says where the warnings went when there were any."""
    global _ROUTER
    router, _ROUTER = _ROUTER, None
    if router is None:
        return
    router.uninstall()
    if router.path is None and router.pending:  # no run directory was made: the console gets them after all
        sys.stderr.write("".join(router.pending))
    elif log is not None and router.count and router.path is not None:
        log(f"{router.count} library warning(s) written to {router.path} (--verbose shows them here)")
