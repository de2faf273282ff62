"""What a launching `recipeforge train` and the workers it starts tell each other: two typed records.

- `WorkerSpec` (``worker.json``, written before launch next to this node's plan): everything a worker
  runs: the plan file, the run directory, where to leave the outcome, the recipe and its overrides, and
  the launching command's `Settings` (its --debug/--verbose/--trust-code, the cache folder). Every
  worker starts from one: ``python -m recipeforge.run.worker RUN/worker.json`` (torchrun, accelerate,
  Ray; Slurm and Kubernetes start `recipeforge train` per node, which starts those). Its path, on the
  worker's command line, is the one thing a worker is told; it reads no ``RECIPEFORGE_*`` variable.
- `Outcome` (``outcome.json``, written by a worker): how the job ended: finished, preempted (the
  stop's signal, step and checkpoint), a user error (a mistake in the recipe or the data only a worker
  could see), a diverged loss, or out of memory with the plan's numbers, with the message the
  launching command prints. The launching command maps it to the exit code (0, 75, 2).

A spec can make a worker run code (`trust_code`, the recipe it names), so a worker takes only one
recipeforge wrote: `read_trusted` refuses a file that is not ``worker.json``, a link, one owned by
another user or writable by others (recipeforge writes it 0600), and any field of the wrong type.
Both records carry a version; a record from another version is refused with the hint to re-run.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.settings import Settings
from recipeforge.stage_specs import Names

WORKER_MODULE = "recipeforge.run.worker"   # ``python -m recipeforge.run.worker SPEC``: the worker entry
SPEC_NAME = "worker.json"
OUTCOME_NAME = "outcome.json"
VERSION = 2           # the worker spec (2: the recipe, its overrides and the settings travel in it)
OUTCOME_VERSION = 1   # the outcome record
_AGAIN = "start the run again with `recipeforge train` (it writes the spec before launching)"


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
    """What a worker runs: the plan file, the run directory, where its outcome goes (None: the launching
    command is this process), the recipe as the launching command loaded it, and its settings."""

    plan: str
    run_dir: str
    outcome: str | None
    recipe: str                                   # the recipe file (absolute)
    overrides: tuple[str, ...] = ()               # `key=value` overrides, in order
    recipe_env: dict[str, str] = field(default_factory=dict)  # RECIPEFORGE_<SECTION>[__KEY] overrides
    settings: Settings = field(default_factory=Settings)
    version: int = VERSION

    def to_json(self) -> str:
        """The spec as its file holds it."""
        data = asdict(self)
        data["overrides"] = list(self.overrides)
        return json.dumps(data, indent=2) + "\n"

    def write(self, path: Path) -> None:
        """Write the spec to `path` atomically, readable by this user only (it may hold credentials given
        as overrides, and it can opt the run into code)."""
        _write_json(path, self.to_json(), private=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str) -> WorkerSpec:
        """A spec from its JSON form, every field checked; a `RecipeError` naming the field otherwise."""
        if raw.get("version") != VERSION:
            raise RecipeError(f"the worker spec {where} was written by another recipeforge version "
                              f"(version {raw.get('version')}, this one reads {VERSION})", hint=_AGAIN)
        names = {f for f in cls.__dataclass_fields__}
        if set(raw) != names:
            raise RecipeError(f"the worker spec {where} has fields {sorted(set(raw) ^ names)} it should not have or "
                              "lacks", hint=_AGAIN)
        for name in ("plan", "run_dir", "recipe"):
            _absolute(raw[name], f"{where}: {name}")
        if raw["outcome"] is not None:
            _absolute(raw["outcome"], f"{where}: outcome")
        overrides, env = raw["overrides"], raw["recipe_env"]
        if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
            raise RecipeError(f"the worker spec {where}: overrides must be a list of strings", hint=_AGAIN)
        if not (isinstance(env, dict) and all(isinstance(k, str) and k.startswith("RECIPEFORGE_") and isinstance(v, str)
                                              for k, v in env.items())):
            raise RecipeError(f"the worker spec {where}: recipe_env must map RECIPEFORGE_<SECTION>[__<KEY>] names to "
                              "strings", hint=_AGAIN)
        return cls(plan=raw["plan"], run_dir=raw["run_dir"], outcome=raw["outcome"], recipe=raw["recipe"],
                   overrides=tuple(overrides), recipe_env=dict(env), settings=_settings(raw["settings"], where))

    @classmethod
    def read_trusted(cls, path: Path) -> WorkerSpec:
        """The spec at `path`, once it is one recipeforge wrote for this user (see the module's note)."""
        path = Path(path)
        if path.name != SPEC_NAME:
            raise RecipeError(f"{path} is not a worker spec (recipeforge names them {SPEC_NAME})", hint=_AGAIN)
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise RecipeError(f"cannot read the worker spec {path}: {exc.strerror}", hint=_AGAIN) from None
        if not stat.S_ISREG(info.st_mode):
            raise RecipeError(f"the worker spec {path} is not a regular file (a link or a device)", hint=_AGAIN)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise RecipeError(f"the worker spec {path} is not private to this user (owner uid {info.st_uid}, mode "
                              f"{stat.S_IMODE(info.st_mode):o}); recipeforge writes it 0600 and trusts no other",
                              hint=_AGAIN)
        return cls.from_dict(_read_json(path, "worker spec"), str(path))


def _absolute(value: object, where: str) -> None:
    if not (isinstance(value, str) and value and Path(value).is_absolute() and "\0" not in value):
        raise RecipeError(f"{where} must be an absolute path (got {value!r})", hint=_AGAIN)


def _settings(raw: object, where: str) -> Settings:
    """`Settings` from the spec, each field of its type."""
    kinds: dict[str, tuple[type, ...]] = {"debug": (bool,), "verbose": (bool,), "trust_code": (bool,),
                                          "trust_source": (str,), "cache_dir": (str, type(None)),
                                          "progress_interval": (int, float), "fault": (str,),
                                          "service_timeout": (int, float)}
    if not isinstance(raw, dict) or set(raw) != set(kinds):
        raise RecipeError(f"the worker spec {where}: settings must hold exactly {sorted(kinds)}", hint=_AGAIN)
    for name, types in kinds.items():
        value = raw[name]
        number = types == (int, float)
        if not isinstance(value, types) or (number and (isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0))):
            raise RecipeError(f"the worker spec {where}: settings.{name} has the wrong type or value ({value!r})",
                              hint=_AGAIN)
    return Settings(**raw)


@dataclass(frozen=True)
class Outcome:
    """How the job ended: `kind`, the message to print, and for a preemption the stop's record."""

    kind: str
    message: str = ""
    preempted: dict[str, Any] | None = field(default=None)
    rank: int = 0
    version: int = OUTCOME_VERSION


def write_outcome(spec: WorkerSpec, outcome: Outcome) -> None:
    """Leave `outcome` for the launching command (atomically; ranks may report at once, the last one
    written is read); nothing when the launching command is this process."""
    if spec.outcome is not None:
        write_outcome_file(Path(spec.outcome), outcome)


def write_outcome_file(path: Path, outcome: Outcome) -> None:
    """Write `outcome` to `path` atomically. A failure to write is not worth hiding the job's own error
    for."""
    try:
        _write_json(path, json.dumps(asdict(outcome), indent=2, default=str) + "\n")
    except OSError:
        pass


def read_outcome(path: Path) -> Outcome | None:
    """The outcome a launched job left at `path`, if any (an unreadable one counts as none)."""
    try:
        raw = json.loads(Path(path).read_text())
        return Outcome(**raw) if raw.get("version") == OUTCOME_VERSION else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_json(path: Path, text: str, *, private: bool = False) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    if private:
        os.chmod(tmp, 0o600)  # an earlier leftover of the same name kept its mode
    os.replace(tmp, path)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read the {what} {path}: {exc}",
                          hint=_AGAIN) from None
    if not isinstance(raw, dict):
        raise RecipeError(f"the {what} {path} is not a JSON object", hint=_AGAIN)
    return raw
