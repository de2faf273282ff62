"""The data of a launched job, prepared without holding the other processes in a collective.

Tokenizing a large dataset can take longer than a process group's timeout, and a rank that waits for
it inside a collective (a barrier, an all-gather) is aborted when the timeout runs out. So:

- `recipeforge train` builds the tokenized-data cache in the launching process, before any worker
  starts (`build_before_launch`); the workers then only read it.
- Workers started directly by a launcher (``torchrun -m recipeforge train ...``) have no launching
  process. Each machine's first rank prepares the data while the other ranks of that machine poll
  for its marker file, ``done`` or ``failed`` (with the error), in a folder named by a token rank 0
  sends to every rank. No collective is open during the wait; one barrier follows it
  (`prepare_on_first_rank`).

`RECIPEFORGE_FAULT=slow_tokenize:<seconds>` makes each preparation of the data (in the launching
process, on each machine's first rank) take that many seconds longer, so the wait can be tested with
a short process-group timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from recipeforge.errors import Location, Problem, RecipeError

if TYPE_CHECKING:
    from recipeforge.components.prepared import PreparedData
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.stages.context import DistInfo

POLL_SECONDS = 0.5
REPORT_EVERY = 60.0  # seconds between "still waiting" lines


class DataRunner(Protocol):
    """A stage runner as far as its data goes: `TrainerStage.prepare` loads the tokenizer and builds (or
    finds) the data cache."""

    def prepare(self) -> PreparedData: ...


def build_before_launch(loaded: LoadedRecipe, *, log: Callable[[str], None]) -> dict[str, Any] | None:
    """Build the tokenized-data cache of a recipe whose stage has one (pretrain, SFT), as
    `recipeforge preprocess` does; returns the data statistics, or None for stages whose trainer
    tokenizes itself (DPO, GRPO)."""
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import RecipeContext
    from recipeforge.stages.lm import LMStage

    cls = runner_class(loaded.recipe.stage)
    if not issubclass(cls, LMStage):
        return None
    return dict(_prepare(cls(RecipeContext(loaded=loaded, log=log))).stats)


def prepare_on_first_rank(make_runner: Callable[[], DataRunner], dist_info: DistInfo, *,
                          broadcast: Callable[[str | None], str | None], barrier: Callable[[], None],
                          log: Callable[[str], None], poll: float = POLL_SECONDS) -> None:
    """Prepare the data once per machine: its first rank loads the tokenizer and builds (or finds)
    the data cache; the machine's other ranks poll for the outcome, then every rank meets at one
    barrier. A failure on the first rank stops the others with its message (a recipe mistake stays
    a `RecipeError`)."""
    token = broadcast(os.urandom(8).hex() if dist_info.is_main else None)  # a folder of this launch only
    folder = Path(tempfile.gettempdir()) / f"recipeforge-data-{token}"
    builder = dist_info.rank - dist_info.local_rank  # the machine's first rank (launchers number contiguously)
    done, failed = folder / f"rank{builder}.done", folder / f"rank{builder}.failed"
    if dist_info.local_rank == 0:
        try:
            _prepare(make_runner())
        except BaseException as exc:
            _publish(failed, json.dumps(_describe(exc)))
            raise
        _publish(done, "")
    else:
        wait_for(done, failed, builder=builder, log=log, poll=poll)
    barrier()
    if dist_info.local_rank == 0:
        shutil.rmtree(folder, ignore_errors=True)  # after the barrier: every rank has seen the outcome


def wait_for(done: Path, failed: Path, *, builder: int, log: Callable[[str], None],
             poll: float = POLL_SECONDS) -> None:
    """Return once `done` exists; raise the builder's error once `failed` does."""
    start = last = time.monotonic()
    while True:
        if failed.is_file():
            raise _error_from(json.loads(failed.read_text() or "{}"), builder)
        if done.is_file():
            return
        now = time.monotonic()
        if now - last >= REPORT_EVERY:
            log(f"waiting for rank {builder} to prepare the data ({now - start:.0f} s so far)")
            last = now
        time.sleep(poll)


def _prepare(runner: DataRunner) -> PreparedData:
    """The runner's tokenizer and data (`TrainerStage.prepare`), after any injected delay."""
    delay = injected_delay()
    if delay:
        time.sleep(delay)
    return runner.prepare()


def injected_delay(fault: str | None = None) -> float:
    """Seconds of `RECIPEFORGE_FAULT=slow_tokenize:<seconds>` (0 when unset); read once per data
    preparation, never on a training step."""
    from recipeforge.settings import current

    point, _, arg = (current().fault if fault is None else fault).partition(":")
    if point != "slow_tokenize":
        return 0.0
    try:
        return max(0.0, float(arg))
    except ValueError:
        return 0.0


def _publish(path: Path, text: str) -> None:
    """Write `path` whole (temp file, rename): a waiting rank never reads half a marker."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _describe(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RecipeError):
        return {"problems": [asdict(p) for p in exc.problems]}
    return {"error": f"{type(exc).__name__}: {exc}"}


def _error_from(data: dict[str, Any], builder: int) -> RecipeError:
    problems = data.get("problems")
    if problems:  # the same user error, reported by every rank
        return RecipeError([Problem(p["message"], Location(**p["location"]) if p.get("location") else None,
                                    p.get("key"), p.get("hint")) for p in problems])
    return RecipeError(f"rank {builder} failed while preparing the data: {data.get('error', 'no message')}")
