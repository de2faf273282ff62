"""The exit codes of the `recipeforge` commands (the top-level --help lists them for users)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL_ERROR = 1
EXIT_USER_ERROR = 2  # a problem in the input: recipe, data, arguments, a run directory in use
EXIT_PUSH_FAILED = 3  # `train`: the run finished and is saved; only output.push_to_hub failed
EXIT_CHECK_FAILED = 4  # `export`: written, but its self-check found it too far from the unquantized model
EXIT_INTERRUPTED = 130  # a Ctrl-C that was not a graceful stop
EXIT_TERMINATED = 143  # SIGTERM during a command that removes its temporary folders first
