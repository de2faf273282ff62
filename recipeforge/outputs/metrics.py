"""metrics.jsonl: every logged metric of a run, one JSON object per line.

Each line has ``split`` (train, eval, data, startup, summary), ``step`` and ``epoch`` next to the metrics with
the names the trainer logs them under (``loss``, ``eval_loss``, ``rewards/accuracies``, ...).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Iterable


class MetricsWriter:
    """Appends metric records to a JSONL file (rank 0 only writes)."""

    def __init__(self, path: Path, *, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: _jsonable(v) for k, v in record.items()}
        clean.setdefault("time", round(time.time(), 3))
        with open(self.path, "a") as fh:
            fh.write(json.dumps(clean) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop records logged after `step` (a resumed run logs those steps again)."""
        if not self.enabled or not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))


def read_metrics(path: Path) -> list[dict]:
    """All records of a metrics.jsonl file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records: Iterable[dict], key: str, split: str | None = None) -> list[float]:
    """The values of one metric in logging order (optionally of one split)."""
    return [r[key] for r in records if key in r and r[key] is not None and (split is None or r.get("split") == split)]


def make_callback(writer: MetricsWriter, extras: Iterable[Callable[[], dict]] = ()):
    """A `TrainerCallback` writing every `on_log` record; `extras` add metrics to training records
    (e.g. the padding share of the batches since the last log)."""
    from transformers import TrainerCallback

    extras = list(extras)

    class MetricsCallback(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            logs = dict(logs)
            if any(k.startswith("eval_") for k in logs):
                split = "eval"
            elif "train_runtime" in logs:
                split = "summary"
            else:
                split = "train"
                for extra in extras:
                    logs.update(extra())
            writer.write({"split": split, "step": state.global_step,
                          "epoch": round(state.epoch, 4) if state.epoch is not None else None, **logs})

    return MetricsCallback()


def _jsonable(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)
