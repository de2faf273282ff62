"""Checkpoints: which ones are complete, and which one a run resumes from.

Checkpoints are staged and published atomically with a completeness marker (see `atomic.py`).
Only marked checkpoints are resumed from; unmarked directories and staging leftovers (a run killed
while saving) are removed before training starts, so rotation never counts them either.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from recipeforge.errors import RecipeError

PREFIX = "checkpoint-"
MARKER = "checkpoint_complete.json"
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "adapter_model.bin")
_STEP = re.compile(rf"^{PREFIX}(\d+)$")


def step_of(path: Path) -> int | None:
    """The global step a checkpoint directory was saved at."""
    m = _STEP.match(path.name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    """Whether `path` is a checkpoint recipeforge published completely (it carries the marker that is
    written, atomically, only after every file of the checkpoint is on disk)."""
    return path.is_dir() and (path / MARKER).is_file()


def looks_complete(path: Path) -> bool:
    """A checkpoint written by another tool (no marker): its trainer state parses and weights exist.
    Only used for an explicitly named `output.resume` path."""
    if is_complete(path):
        return True
    if not path.is_dir():
        return False
    try:
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    has_weights = any((path / f).exists() for f in WEIGHT_FILES) or any(path.glob("global_step*"))
    return has_weights


def checkpoints(directory: Path) -> list[Path]:
    """All checkpoint directories, oldest step first."""
    if not directory.is_dir():
        return []
    found = [(step_of(p), p) for p in directory.iterdir() if p.is_dir() and step_of(p) is not None]
    return [p for _, p in sorted(found)]


def newest_complete(directory: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    done = [p for p in checkpoints(directory) if is_complete(p)]
    return done[-1] if done else None


def remove_incomplete(directory: Path) -> list[Path]:
    """Delete checkpoint directories that were never finished, and staging leftovers of a save that
    was killed; returns what was removed."""
    removed = []
    staging = directory / ".staging"
    if staging.is_dir():
        shutil.rmtree(staging, ignore_errors=True)
        removed.append(staging)
    for p in checkpoints(directory):
        if not is_complete(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def resume_checkpoint(resume: str, directory: Path) -> Path | None:
    """The checkpoint `output.resume` asks for: newest complete (auto), none (never), or a path."""
    if resume == "never":
        return None
    if resume == "auto":
        return newest_complete(directory)
    path = Path(resume).expanduser()
    if not looks_complete(path):
        raise RecipeError(f"cannot resume from '{resume}': not a complete checkpoint directory",
                          key="output.resume",
                          hint="give a checkpoints/checkpoint-<step> directory of an earlier run, or use auto")
    return path
