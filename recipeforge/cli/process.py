"""A command that owns its process (`preprocess`, run as the process itself): the process ended without the
interpreter's teardown once it succeeds (its start-up is kept out of the garbage collector's way by
`recipeforge.start_up`)."""

from __future__ import annotations

import os
import sys


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

