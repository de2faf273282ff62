"""The records the MCP tools return, made by the CLI's own functions, and every error as data.

A tool never raises: a `RecipeError` becomes ``{"error": {"message", "location", "key", "hint"}}`` (the
first problem; ``problems`` lists them all when there are several), located in the recipe as the CLI
locates it, and an internal error becomes a one-line message without a traceback.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from recipeforge.cli.error_data import error_record
from recipeforge.errors import RecipeError, bounded_text

Record = dict[str, Any]


def as_data(make: Callable[[argparse.Namespace], Record], args: argparse.Namespace) -> Record:
    """`make(args)`, or its error as data: a `RecipeError` located as the CLI locates it, anything else
    as one line (``internal error: ...``) without a traceback."""
    try:
        return make(args)
    except RecipeError as exc:
        return error_record(exc, args)
    except Exception as exc:  # an internal error: the agent gets a line, never a traceback
        from recipeforge.config.secrets import scrub

        return {"error": {"message": f"internal error: {type(exc).__name__}: {bounded_text(scrub(str(exc)))}",
                          "location": None, "key": None, "hint": "please report it"}}


def recipe_namespace(command: str, recipe: str, overrides: Sequence[str] | None = None,
                     hardware: str | None = None) -> argparse.Namespace:
    """The arguments the CLI's command would parse from ``recipeforge COMMAND RECIPE [overrides]``."""
    return argparse.Namespace(command=command, recipe=recipe, overrides=list(overrides or ()), hardware=hardware,
                              nnodes=None, nproc_per_node=None, ray=False, json=True)


def check_overrides(overrides: Sequence[str] | None) -> None:
    """Each override must be one `key=value` or `~key` string, as on the command line, and none may touch
    `allow_code`: the opt-in to run code a recipe names is the recipe's own (or the server's --trust-code),
    never the agent's."""
    from recipeforge.cli.common import looks_like_override

    for item in overrides or ():
        if not isinstance(item, str) or not looks_like_override(item):
            raise RecipeError(f"override {item!r} is not key=value or ~key", key="overrides",
                              hint="e.g. train.learning_rate=1e-4, or ~adapter.dropout to delete a key")
        if override_root(item) == "allow_code":
            raise RecipeError(f"override {item!r}: allow_code is not set by an override here", key="allow_code",
                              hint="running code a recipe names is the user's decision: allow_code: true in the "
                                   "recipe file itself, or a server started with recipeforge mcp --trust-code")


def override_root(item: str) -> str:
    """The top-level key an override sets or deletes (`train` of ``train.max_steps=3``, ``~train.x``)."""
    key = item[1:] if item.startswith("~") else item.partition("=")[0]
    return key.strip().split(".", 1)[0].split("[", 1)[0].strip()


def validate(args: argparse.Namespace) -> Record:
    """`recipeforge validate --json`."""
    from recipeforge.cli.recipes import validation_record

    check_overrides(args.overrides)
    return validation_record(args)


def plan(args: argparse.Namespace) -> Record:
    """`recipeforge plan --json` (with `--hardware` when the namespace names it)."""
    from recipeforge.cli.planning import checked_plan, plan_json

    check_overrides(args.overrides)
    record: Record = json.loads(plan_json(checked_plan(args), indent=None))
    return record


def resolve(args: argparse.Namespace) -> Record:
    """The fully resolved recipe (extends, overrides, ${...}, defaults), as `resolve` writes it, as data."""
    from recipeforge.cli.common import load
    from recipeforge.config.dump import resolved_data

    check_overrides(args.overrides)
    data = json.loads(json.dumps(resolved_data(load(args)), default=str))
    return {"recipe": args.recipe, "resolved": data}


def diff(args: argparse.Namespace) -> Record:
    """`recipeforge diff A B --json`."""
    from recipeforge.cli.recipes import diff_record

    return diff_record(args.a, args.b)


def report(args: argparse.Namespace) -> Record:
    """`recipeforge report RUN_DIR --json`: the run's summary record."""
    from recipeforge.cli.evaluate import report_records

    return report_records([args.run_dir])[0]


def schema(args: argparse.Namespace) -> Record:
    """`recipeforge schema` (JSON): the whole recipe schema, or one top-level section with the definitions
    it refers to."""
    from recipeforge.config.jsonschema import recipe_json_schema

    full: Record = recipe_json_schema()
    section = args.section
    if not section:
        return full
    defs: Record = full.get("$defs", {})
    sections: Record = {}
    for variant in full.get("oneOf", ()):
        for name, prop in defs[variant["$ref"].rsplit("/", 1)[-1]].get("properties", {}).items():
            sections.setdefault(name, prop)
    if section not in sections:
        from recipeforge.errors import did_you_mean

        raise RecipeError(f"the recipe has no section {section!r}", key="section",
                          hint=did_you_mean(section, sections) or f"one of: {', '.join(sections)}")
    return {"section": section, "schema": sections[section], "$defs": _referenced(sections[section], defs)}


def _referenced(node: object, defs: Record) -> Record:
    """The definitions `node` refers to, directly or through other definitions."""
    found: Record = {}
    todo = [node]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.rsplit("/", 1)[-1]
                if name not in found and name in defs:
                    found[name] = defs[name]
                    todo.append(defs[name])
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found
