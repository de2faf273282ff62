"""The program: parse the command line, run the command, and turn what it raised into an exit code and a
short message (a traceback only with --debug)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from recipeforge.cli.app import GLOBAL_FLAGS, build_parser
from recipeforge.cli.common import looks_like_override
from recipeforge.cli.exit_codes import EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USER_ERROR
from recipeforge.cli.process import end_process
from recipeforge.errors import RecipeError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code.

    With the process's own command line (no `argv`: the `recipeforge` script, ``python -m recipeforge``),
    a command that runs a pipeline and prints its results (`preprocess`) owns the process: it ends the
    process itself once it succeeds (`process.end_process`). That command and `train` keep their start-up
    out of the garbage collector's way (`recipeforge.start_up`).
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may come after flags too (`train x.yaml --dry-run train.learning_rate=1e-4`); anything
    # else unknown is still an error.
    overrides = [a for a in extra if looks_like_override(a)]
    if hasattr(args, "overrides") and overrides:
        args.overrides = [*args.overrides, *overrides]
        extra = [a for a in extra if a not in overrides]
    # The global flags also after the command (`recipeforge eval RUN --trust-code`), where a hint that
    # says "pass --trust-code" leads the user to type them.
    for flag in GLOBAL_FLAGS:
        if flag in extra:
            setattr(args, flag[2:].replace("-", "_"), True)
            extra = [a for a in extra if a != flag]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = args.debug or os.environ.get("RECIPEFORGE_DEBUG", "") not in ("", "0")
    if args.verbose:  # read where a run starts routing warnings (launched workers inherit it)
        from recipeforge.settings import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
    if args.trust_code:  # read by the recipe loader and by whatever imports user code later
        from recipeforge.settings import TRUST_ENV

        os.environ[TRUST_ENV] = "1"
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USER_ERROR
    # A command run as the process itself (no argv) that asks for it owns the process: it ends the process
    # when done (`process.end_process`). It, and a command that trains, keep their start-up out of the
    # garbage collector's way: paused now, back on once their libraries are imported (`start_up`).
    args.owns_process = argv is None and getattr(args, "owns_process", False)
    if argv is None and (args.owns_process or getattr(args, "pauses_collector", False)):
        from recipeforge import start_up

        start_up.pause()
    try:
        if getattr(args, "cleans_up", False):  # SIGTERM ends these after their temporary folders are removed
            from recipeforge.outputs.ownership import stop_on_sigterm

            with stop_on_sigterm():
                code = func(args)
        else:
            code = func(args)
    except RecipeError as exc:
        if debug:
            raise
        loaded = getattr(args, "loaded", None)
        if loaded is not None:
            from recipeforge.errors import locate_problems

            exc = locate_problems(exc, loaded.tree.locate)
        from recipeforge.config.secrets import scrub

        print(f"error: {scrub(exc.render())}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        from recipeforge.outputs.ownership import Terminated

        if isinstance(exc, Terminated):  # SIGTERM during a command that cleans up after itself
            print("terminated (SIGTERM); temporary folders removed", file=sys.stderr)
            return EXIT_TERMINATED
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal bug: short message, traceback with --debug
        if debug:
            raise
        from recipeforge.config.secrets import scrub
        from recipeforge.outputs.preflight import write_failure

        failure = write_failure(exc)  # a full disk, a read-only or forbidden path: the user's to fix
        if failure is not None:
            print(f"error: {scrub(failure.render())}", file=sys.stderr)
            return EXIT_USER_ERROR

        from recipeforge.backends.peer_loss import lost_peer_message

        lost = lost_peer_message(exc)  # a worker whose peer died: the launcher reports the cause
        if lost is not None:
            print(f"error: {scrub(lost)}", file=sys.stderr)
            return EXIT_INTERNAL_ERROR
        from recipeforge.errors import bounded_text

        print(f"internal error: {type(exc).__name__}: {bounded_text(scrub(str(exc)))}\n(rerun with --debug for the traceback, "
              f"and please report it)", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    if args.owns_process and code == 0:
        end_process(code)
    return code
