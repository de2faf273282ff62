"""A training process around the worker entry: the libraries' warnings routed, stop signals taken, the
run directory's lock released at the end; and how a launched worker's ending becomes its exit code."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError
from recipeforge.log import log
from recipeforge.stages.context import DistInfo

EXIT_INTERNAL_ERROR = 1   # the values `recipeforge` itself exits with (`cli.exit_codes`)
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


@contextmanager
def training_process(dist: DistInfo, *, stops: bool) -> Iterator[None]:
    """While a process trains: library warnings go to RUN/logs/warnings.log (not the console); with
    `stops`, SIGTERM/SIGUSR1/Ctrl-C ask for a checkpoint and a stop, taken as early as possible so a
    stop during setup is kept (a launching process that trains in place takes them itself)."""
    from recipeforge.outputs import library_warnings, run_lock
    from recipeforge.stages import preemption

    library_warnings.route_library_warnings(dist.rank)
    try:
        if stops:
            preemption.install()
        yield
    finally:
        library_warnings.stop_routing(log=log if dist.is_main else None)
        preemption.uninstall()
        run_lock.release_all()


def exit_code(exc: BaseException, loaded: LoadedRecipe | None, *, debug: bool) -> int:
    """A launched worker's exit code for how it ended, its message on stderr. A stop is 0 and a user
    error 2: the launching command reads the outcome this worker left and reports them (exit 75, 2)."""
    from recipeforge.config.secrets import scrub
    from recipeforge.stages.preemption import Preempted

    if isinstance(exc, Preempted):
        return 0
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else EXIT_INTERNAL_ERROR
    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if debug:
        raise exc
    if isinstance(exc, RecipeError):
        if loaded is not None:
            from recipeforge.errors import locate_problems

            exc = locate_problems(exc, loaded.tree.locate)
        print(f"error: {scrub(exc.render())}", file=sys.stderr)
        return EXIT_USER_ERROR
    if not isinstance(exc, Exception):
        raise exc
    from recipeforge.outputs.preflight import write_failure

    failure = write_failure(exc)  # a full disk, a read-only or forbidden path: the user's to fix
    if failure is not None:
        print(f"error: {scrub(failure.render())}", file=sys.stderr)
        return EXIT_USER_ERROR
    from recipeforge.backends.peer_loss import lost_peer_message
    from recipeforge.errors import bounded_text

    lost = lost_peer_message(exc)  # a worker whose peer died: the launcher reports the cause
    print(f"error: {scrub(lost)}" if lost is not None else
          f"internal error: {type(exc).__name__}: {bounded_text(scrub(str(exc)))}\n(rerun with --debug for the "
          "traceback, and please report it)", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
