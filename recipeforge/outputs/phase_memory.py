"""The measured memory of each phase of a run (load, train, eval, save, merge): this process's peak
resident size in each, written to `phase_memory/rank<N>.json` in the run directory, beside the
planner's per-phase table (`plan.phases`, plan.json `extra.phases`).

The peak is the kernel's high-water mark of the resident set (`VmHWM` in /proc/self/status), reset
at the start of each phase by writing 5 to /proc/self/clear_refs (Linux 4.0+), so each phase's figure
is its own. A phase inside another (the final evaluation inside training) folds the outer phase's peak
so far into its record first, and the outer phase goes on from a fresh mark. Where the mark cannot be
reset, the figure is the resident size at the phase's end (`measure: "end"`), a lower bound.
GPU memory is torch's `max_memory_allocated`, reset the same way, when CUDA is in use.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from transformers import Trainer

GIB = 1024 ** 3


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_mark() -> bool:
    """Reset the resident high-water mark; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _gpu_peak(reset: bool) -> int | None:
    import sys

    torch = sys.modules.get("torch")  # never imported for this: a run without torch has no GPU figure
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peak = int(torch.cuda.max_memory_allocated())
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


class PhaseMeter:
    """Peak resident memory per phase of this process, written after each phase ends."""

    def __init__(self, root: Path, rank: int = 0) -> None:
        self.path = Path(root) / "phase_memory" / f"rank{rank}.json"
        self.rank = rank
        self.peaks: dict[str, dict[str, Any]] = {}
        self._stack: list[str] = []
        self._resets = True

    def _fold(self, name: str) -> None:
        """Fold the mark since the last reset into `name`'s record, and start a new mark."""
        hwm = _status_kib("VmHWM" if self._resets else "VmRSS")
        gpu = _gpu_peak(reset=True)
        record = self.peaks.setdefault(name, {"host_gb": 0.0, "measure": "vmhwm" if self._resets else "end"})
        if hwm is not None:
            record["host_gb"] = max(record["host_gb"], round(hwm * 1024 / GIB, 3))
        if gpu is not None:
            record["gpu_gb"] = max(record.get("gpu_gb", 0.0), round(gpu / GIB, 3))
        self._resets = _reset_mark() and self._resets

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the phase `name` (a phase met again keeps its largest peak)."""
        if self._stack:
            self._fold(self._stack[-1])  # what the outer phase reached before this one
        else:
            self._resets = _reset_mark()
            _gpu_peak(reset=True)
        self._stack.append(name)
        try:
            yield
        finally:
            self._stack.pop()
            self._fold(name)
            self._write()

    def _write(self) -> None:
        import os

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"rank": self.rank, "phases": self.peaks}, indent=2) + "\n")
        os.replace(tmp, self.path)  # a reader never sees half a file


_METER: PhaseMeter | None = None


def start(root: Path, rank: int = 0) -> PhaseMeter:
    """The process's meter for the run at `root` (one per process)."""
    global _METER
    _METER = PhaseMeter(root, rank)
    return _METER


@contextmanager
def phase(name: str) -> Iterator[None]:
    """`PhaseMeter.phase` of the process's meter; nothing is measured before `start`."""
    if _METER is None:
        yield
        return
    with _METER.phase(name):
        yield


def measure_trainer(trainer: Trainer) -> None:
    """Measure `trainer`'s evaluations as the `eval` phase and its checkpoint saves as `save`,
    wherever the training loop runs them (the Trainer calls both through the instance)."""
    for method, name in (("evaluate", "eval"), ("_save_checkpoint", "save")):
        inner = getattr(trainer, method, None)
        if inner is None:
            continue

        def measured(*args: Any, _inner: Callable[..., Any] = inner, _name: str = name, **kwargs: Any) -> Any:
            with phase(_name):
                return _inner(*args, **kwargs)

        setattr(trainer, method, measured)


def read(root: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """rank -> phase -> its record, as the run's processes wrote them."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for path in sorted((Path(root) / "phase_memory").glob("rank*.json")):
        raw = json.loads(path.read_text())
        out[int(raw["rank"])] = raw["phases"]
    return out
