"""A command that owns its process (`preprocess`, run as the process itself): its start-up objects kept out
of the garbage collector's way, and the process ended without the interpreter's teardown once it succeeds."""

from __future__ import annotations

import os
import sys


def freeze_start_up() -> None:
    """Import what preprocessing runs on (transformers' tokenizer classes, datasets), then freeze every
    object made so far, and turn the garbage collector back on (`main` turned it off).

    The ~250k objects of those libraries' modules live until the process ends, yet each full collection
    walked them all again: ~0.15 s while importing and ~0.3 s while tokenizing 20k rows. Frozen, they are
    never examined (nor collected: only for a process the command owns); forked workers then share
    their pages instead of copying them when a collection would touch them.
    """
    import gc

    try:
        import datasets  # noqa: F401
        from transformers import PreTrainedTokenizerFast  # noqa: F401
    except ImportError:  # the command itself says what is missing
        pass
    gc.freeze()
    gc.enable()


def end_process(code: int) -> None:
    """End the process with `code` as a normal exit does, less the teardown of the interpreter.

    Freeing every module and object of transformers, datasets and pyarrow takes ~0.2 s at exit and
    does nothing for results already written and printed. The atexit handlers run (logging,
    multiprocessing, temporary folders, any the caller registered) and the output is flushed, as at
    any exit. While a non-daemon thread runs, this returns and the process exits the usual way,
    waiting for it.
    """
    import atexit
    import threading

    main_thread = threading.main_thread()
    if any(t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)

