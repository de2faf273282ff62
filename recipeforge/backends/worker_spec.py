"""What a launching `recipeforge train` and the workers it starts tell each other: two typed records.

- `WorkerSpec` (``worker.json``, written before launch next to this node's plan): the plan to run,
  the run directory, and where to leave the outcome. Its path is the one value that travels by
  environment (``RECIPEFORGE_WORKER_SPEC``), beside what torchrun/accelerate set themselves.
- `Outcome` (``outcome.json``, written by a worker): how the job ended: finished, preempted (the
  stop's signal, step and checkpoint), a user error (a mistake in the recipe or the data only a worker
  could see), a diverged loss, or out of memory with the plan's numbers, with the message the
  launching command prints. The launching command maps it to the exit code (0, 75, 2).

Both carry a version; a record from another version is refused with the hint to re-run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.stage_specs import Names

SPEC_ENV = "RECIPEFORGE_WORKER_SPEC"
SPEC_NAME = "worker.json"
OUTCOME_NAME = "outcome.json"
VERSION = 1


class OutcomeKind(Names):
    """How a launched job ended, as its workers saw it."""

    FINISHED = "finished"
    PREEMPTED = "preempted"
    USER_ERROR = "user_error"          # a mistake in the recipe or the data only a worker could see
    DIVERGED = "diverged"              # the loss went NaN/inf or grew past train.divergence's limit
    OUT_OF_MEMORY = "out_of_memory"    # with the plan's numbers and what would fit

    @classmethod
    def user_errors(cls) -> tuple["OutcomeKind", ...]:
        """The kinds the launching command reports as a user error (exit 2)."""
        return (cls.USER_ERROR, cls.DIVERGED, cls.OUT_OF_MEMORY)


@dataclass(frozen=True)
class WorkerSpec:
    """What a launched worker runs: the plan file, the run directory, where its outcome goes."""

    plan: str
    run_dir: str
    outcome: str
    version: int = VERSION

    def write(self, path: Path) -> None:
        """Write the spec to `path` (atomically)."""
        _write_json(path, asdict(self))

    @classmethod
    def read(cls, path: Path) -> "WorkerSpec":
        """The spec at `path`; a missing, unreadable or other-version spec is a `RecipeError`."""
        raw = _read_json(path, "worker spec")
        if raw.get("version") != VERSION:
            raise RecipeError(f"the worker spec {path} was written by another recipeforge version "
                              f"(version {raw.get('version')}, this one reads {VERSION})",
                              hint="start the run again with `recipeforge train`")
        return cls(**raw)


@dataclass(frozen=True)
class Outcome:
    """How the job ended: `kind`, the message to print, and for a preemption the stop's record."""

    kind: str
    message: str = ""
    preempted: dict[str, Any] | None = field(default=None)
    rank: int = 0
    version: int = VERSION


def current_spec() -> WorkerSpec | None:
    """The spec of this process when `recipeforge train` launched it (None otherwise)."""
    path = os.environ.get(SPEC_ENV)
    return WorkerSpec.read(Path(path)) if path else None


def launched_worker() -> bool:
    """Whether this process is a worker `recipeforge train` launched."""
    return bool(os.environ.get(SPEC_ENV))


def write_outcome(spec: WorkerSpec, outcome: Outcome) -> None:
    """Leave `outcome` for the launching command (atomically; ranks may report at once, the last one
    written is read)."""
    write_outcome_file(Path(spec.outcome), outcome)


def write_outcome_file(path: Path, outcome: Outcome) -> None:
    """Write `outcome` to `path` atomically. A failure to write is not worth hiding the job's own error
    for."""
    try:
        _write_json(path, asdict(outcome))
    except OSError:
        pass


def read_outcome(path: Path) -> Outcome | None:
    """The outcome a launched job left at `path`, if any (an unreadable one counts as none)."""
    try:
        raw = json.loads(Path(path).read_text())
        return Outcome(**raw) if raw.get("version") == VERSION else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read the {what} {path}: {exc}",
                          hint="start the run with `recipeforge train` (it writes the spec before launching)") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"the {what} {path} is not a JSON object", hint="start the run again with `recipeforge train`")
    return raw
