"""Checkpoints: which ones are complete, and which one a run resumes from.

Checkpoints are staged and published atomically with a completeness marker (see `atomic.py`).
Only marked checkpoints are resumed from; unmarked directories and staging leftovers (a run killed
while saving) are removed before training starts, so rotation never counts them either.

Before a run resumes, the checkpoint it picks is verified against its manifest (`manifest.py`). A
damaged one (a truncated or deleted file) is never deleted: it is renamed aside to
``checkpoint-<step>.corrupt-<time>``, which neither resume nor rotation looks at, and the next newest
checkpoint that verifies is used instead.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Callable

from recipeforge.errors import RecipeError
from recipeforge.outputs.manifest import MANIFEST, WEIGHT_FILES, verify

PREFIX = "checkpoint-"
MARKER = "checkpoint_complete.json"
CORRUPT = ".corrupt-"   # checkpoint-<step>.corrupt-<time>: set aside, kept for inspection
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


def verify_checkpoint(path: Path) -> list[str]:
    """Problems of the checkpoint at `path` (empty when it verifies): against its manifest, or for a
    checkpoint without one (older versions, other tools) the checks that need none."""
    required = False
    try:
        marker = json.loads((path / MARKER).read_text())
        required = isinstance(marker, dict) and marker.get("manifest") == MANIFEST
    except (OSError, ValueError):
        pass
    return verify(path, required_manifest=required)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint out of the way (``checkpoint-<step>.corrupt-<time>``); never deletes."""
    target = path.with_name(f"{path.name}{CORRUPT}{time.strftime('%Y%m%dT%H%M%S')}")
    n = 1
    while target.exists():
        target = target.with_name(f"{path.name}{CORRUPT}{time.strftime('%Y%m%dT%H%M%S')}-{n}")
        n += 1
    path.rename(target)
    return target


def newest_verified(directory: Path, log: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete checkpoint that verifies; damaged newer ones are reported and set aside."""
    for path in reversed([p for p in checkpoints(directory) if is_complete(p)]):
        problems = verify_checkpoint(path)
        if not problems:
            return path
        moved = set_aside(path)
        if log is not None:
            log(f"checkpoint {path} is damaged, not resuming from it: " + "; ".join(problems[:5])
                + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
                + f". Moved aside to {moved.name}; trying the next newest checkpoint")
    return None


def resume_checkpoint(resume: str, directory: Path, *, verify: bool = False,
                      log: Callable[[str], None] | None = None) -> Path | None:
    """The checkpoint `output.resume` asks for: newest complete (auto), none (never), or a path.

    With `verify` (the process that prepares the run) the checkpoint's files are checked first: for
    auto, damaged checkpoints are set aside and the newest intact one is chosen; a named path that
    fails is a user error naming the file. Without it (every rank afterwards) the choice is cheap and
    the same, since damaged checkpoints were already moved aside.
    """
    if resume == "never":
        return None
    if resume == "auto":
        return newest_verified(directory, log) if verify else newest_complete(directory)
    path = Path(resume).expanduser()
    problems = verify_checkpoint(path) if verify and path.is_dir() else []
    if not problems and not looks_complete(path):
        raise RecipeError(f"cannot resume from '{resume}': not a complete checkpoint directory",
                          key="output.resume",
                          hint="give a checkpoints/checkpoint-<step> directory of an earlier run, or use auto")
    if problems:
        raise RecipeError(f"cannot resume from '{resume}': the checkpoint is damaged: " + "; ".join(problems),
                          key="output.resume",
                          hint="name another checkpoint of that run, or use resume: auto (it skips damaged ones)")
    return path
