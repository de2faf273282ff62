"""The MCP `eval` tool: `recipeforge eval --json` in a process of its own.

Evaluation loads torch, the model and lm-evaluation-harness, which the server's process never imports,
so the tool starts ``python -m recipeforge [--trust-code] eval --json [flags] -- TARGET...`` (an argv list,
no shell; targets after ``--`` so none is read as a flag) and returns the record it prints, or its error
as data. Task files that run code still need the opt-in: the recipe's own allow_code for its eval.tasks,
or a server started with --trust-code; the tool never adds the flag on its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from recipeforge.cli.mcp_server.records import Record
from recipeforge.errors import RecipeError, bounded_text

DEFAULT_TIMEOUT_S = 3600


def eval_argv(targets: Sequence[str], tasks: Sequence[str] | None, *, limit: int | None, batch_size: int | None,
              checkpoints: bool, trust_code: bool) -> list[str]:
    """The command line of the evaluation, each value checked (raises `RecipeError` at the argument)."""
    if not targets:
        raise RecipeError("no run to evaluate", key="targets", hint="give a run directory or the recipe that trained it")
    for name, values in (("targets", targets), ("tasks", tasks or ())):
        for value in values:
            if not isinstance(value, str) or not value.strip() or value.startswith("-") or "\0" in value:
                raise RecipeError(f"{name}: {value!r} is not a path or a task name", key=name,
                                  hint="a run directory or recipe file for targets; a task name or task file "
                                       "for tasks")
    for name, number in (("limit", limit), ("batch_size", batch_size)):
        if number is not None and (not isinstance(number, int) or isinstance(number, bool) or number < 1):
            raise RecipeError(f"{name} must be a whole number, 1 or more", key=name)
    argv = [sys.executable, "-m", "recipeforge", *(["--trust-code"] if trust_code else []), "eval", "--json"]
    if tasks:
        argv += ["--tasks", ",".join(tasks)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if batch_size is not None:
        argv += ["--batch-size", str(batch_size)]
    if checkpoints:
        argv.append("--checkpoints")
    return [*argv, "--", *targets]


def run_eval(argv: list[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Record:
    """Run the evaluation `eval_argv` built and return its record (raises `RecipeError` when it fails)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
                              close_fds=True)
    except subprocess.TimeoutExpired:
        raise RecipeError(f"the evaluation did not finish within {timeout_s:g} s and was stopped",
                          key="timeout_s", hint="evaluate fewer examples (limit) or allow more time") from None
    try:
        record = json.loads(done.stdout)
    except ValueError:
        record = None
    if isinstance(record, dict) and ("runs" in record or "error" in record):
        return record
    from recipeforge.config.secrets import scrub

    tail = " / ".join(line for line in done.stderr.strip().splitlines()[-3:] if line.strip())
    raise RecipeError(f"the evaluation failed (exit {done.returncode}): {bounded_text(scrub(tail)) or 'no output'}",
                      key="targets")
