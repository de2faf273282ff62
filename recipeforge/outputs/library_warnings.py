"""Library noise kept out of the console: Python warnings raised inside libraries (transformers'
FutureWarnings, TRL's notes) and the warning records of the libraries' loggers say nothing the user
can act on, so they go to ``RUN/logs/warnings.log``. Warnings from the user's own code and errors
stay on the console, as do recipeforge's own messages (printed, not warned). ``--verbose`` or
``RECIPEFORGE_VERBOSE=1`` (`outputs.console.verbose`) leaves everything on the console.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import time
import warnings
from pathlib import Path

from recipeforge.outputs.console import verbose

WARNINGS_LOG = Path("logs") / "warnings.log"
# Loggers of the libraries a run drives; their WARNING records go to the warnings log.
# torch.utils._pytree: deprecation notes torch prints when a library (torchao, imported by
# transformers whenever installed) registers its types at import.
# lm_eval: `recipeforge eval`'s harness (its notes on being handed a model object).
LIBRARY_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets", "huggingface_hub", "torchao",
                   "bitsandbytes", "deepspeed", "torch.utils._pytree", "lm_eval")


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
        from recipeforge.credentials import redact_credentials

        self.count += 1
        # A library's warning may quote a tracker URL with its password, or a token.
        rank = f" [rank {self.rank}]" if self.rank else ""
        entry = f"[{time.strftime('%H:%M:%S')}]{rank} {redact_credentials(text)}\n"
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
