"""The `recipeforge` command line: parse arguments, call the library, render results and errors.

One module per group of commands (`recipes`, `planning`, `train`, `launch`, `after`, `use`, `evaluate`),
each adding its commands' parsers and running them; `app.COMMANDS` is the table --help follows; `entry.main`
maps what a command raised to an exit code (`exit_codes`). Light paths (`--help`, `validate`, `resolve`,
`schema`, `plan`, `launch`) import neither torch nor transformers; training imports them only inside the
commands that train.
"""

from __future__ import annotations

from recipeforge.cli.app import build_parser
from recipeforge.cli.entry import main

__all__ = ["build_parser", "main"]
