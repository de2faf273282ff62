"""recipeforge's console messages, through the standard `logging` module.

Every message of a run goes to the ``recipeforge`` logger; its one handler prints it to stderr as
``[recipeforge] message``, with credentials redacted. The logger does not propagate, so an
application that configures the root logger sees no duplicate lines; one that wants the messages
elsewhere adds a handler to ``logging.getLogger("recipeforge")`` (or raises its level to silence it).
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "recipeforge"
PREFIX = "[recipeforge] "


class ConsoleHandler(logging.Handler):
    """Prints each record to the current ``sys.stderr`` (looked up at each message, so a redirected
    stream is honoured), prefixed and with credentials redacted, flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        from recipeforge.credentials import redact_credentials

        try:
            print(PREFIX + redact_credentials(record.getMessage()), file=sys.stderr, flush=True)
        except Exception:  # a closed stream must not end a run
            self.handleError(record)


def get_logger() -> logging.Logger:
    """The ``recipeforge`` logger, with its console handler installed once."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def log(message: str) -> None:
    """Print `message` on the console through the ``recipeforge`` logger (info level)."""
    get_logger().info(message)
