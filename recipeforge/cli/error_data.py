"""A `RecipeError` as data, located as the CLI locates it: what `--json` commands print on an error and what
the MCP tools return (``{"error": {"message", "location", "key", "hint"}}``, ``problems`` when several)."""

from __future__ import annotations

import argparse
from typing import Any

from recipeforge.errors import Problem, RecipeError, bounded_text

Record = dict[str, Any]


def problem_record(problem: Problem) -> Record:
    """One problem as data: its message, `file:line[:col]`, dotted key and hint (None where unknown)."""
    return {"message": bounded_text(problem.message),
            "location": problem.location.render() if problem.location is not None else None,
            "key": problem.key, "hint": bounded_text(problem.hint) if problem.hint else None}


def error_record(exc: RecipeError, args: argparse.Namespace | None = None) -> Record:
    """`exc` as data; located in the recipe `args` loaded (as the CLI does) when its problems have no place."""
    loaded = getattr(args, "loaded", None)
    if loaded is not None:
        from recipeforge.errors import locate_problems

        exc = locate_problems(exc, loaded.tree.locate)
    from recipeforge.config.secrets import scrub

    problems = [problem_record(p) for p in exc.problems] or [{"message": scrub(str(exc)), "location": None,
                                                              "key": None, "hint": None}]
    for p in problems:
        p["message"] = scrub(p["message"])
    error: Record = dict(problems[0])
    if len(problems) > 1:
        error["problems"] = problems
    return {"error": error}
