"""Overrides on top of the composed recipe: ``RECIPEFORGE_*`` environment variables, then CLI dotlist.

Environment: ``RECIPEFORGE_TRAIN__LEARNING_RATE=1e-4`` sets ``train.learning_rate`` (``__`` separates
levels, names are lower-cased); only variables whose first part is a recipe section are read, so
settings such as ``RECIPEFORGE_CACHE_DIR`` never leak in. CLI: ``train.learning_rate=1e-4`` sets,
``~adapter.dropout`` deletes, ``data.datasets.0.path=x.jsonl`` (or ``data.datasets[0].path``, as errors
print keys) indexes lists. Values are typed by YAML
rules (``1e-4`` is a float, ``true`` a bool, ``[a, b]`` a list).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from recipeforge.config.load import MAX_DEPTH, load_yaml_value
from recipeforge.config.tree import ConfigTree
from recipeforge.credentials import is_secret_key
from recipeforge.errors import Location, Problem, RecipeError
from recipeforge.json_value import JSONValue

ENV_PREFIX = "RECIPEFORGE_"


def apply_env(tree: ConfigTree, environ: Mapping[str, str], sections: Iterable[str]) -> None:
    """Apply ``RECIPEFORGE_<SECTION>[__<KEY>...]`` variables whose section is a recipe key."""
    sections = set(sections)
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if parts[0] not in sections or not all(parts):
            continue
        path = tuple(int(p) if p.isdecimal() else p for p in parts)
        loc = Location(f"<env {name}>")
        _set(tree, path, _parse_value(environ[name], loc), loc)


def apply_cli(tree: ConfigTree, args: Iterable[str]) -> None:
    """Apply ``a.b=value`` and ``~a.b`` arguments in order; all bad arguments reported together."""
    problems: list[Problem] = []
    for arg in args:
        try:
            _apply_one(tree, arg)
        except RecipeError as exc:
            problems.extend(exc.problems)
    if problems:
        raise RecipeError(problems)


@dataclass(frozen=True)
class FlagValue:
    """A value a command-line flag puts into the recipe (``--hardware 8xH100-80GB`` sets `hardware`).

    Applied after every other override, whether or not the recipe sets the key: the flag is what the
    user asked for on this command, and its location names the flag."""

    path: tuple
    value: Any
    flag: str  # as typed, e.g. "--hardware 8xH100-80GB"


def apply_flags(tree: ConfigTree, flags: Iterable[FlagValue]) -> None:
    """Set each flag's value in place of whatever the recipe (or its overrides) had there."""
    for flag in flags:
        _set(tree, flag.path, flag.value, Location(f"<cli {flag.flag}>"))


def _apply_one(tree: ConfigTree, arg: str) -> None:
    loc = _cli_location(arg)
    if arg.startswith("~"):
        path = _parse_path(arg[1:], arg)
        if not tree.delete(path):
            raise RecipeError(f"cannot delete '{arg[1:]}': the recipe does not set it", location=loc)
        return
    key, sep, raw = arg.partition("=")
    if not sep:
        raise RecipeError(f"override {arg!r} is not key=value", location=loc,
                          hint="write e.g. train.learning_rate=1e-4, or ~key to delete a key")
    path = _parse_path(key.strip(), arg)
    _set(tree, path, _parse_value(raw, loc), loc)


def _cli_location(arg: str) -> Location:
    # The argument names its own location; a credential in it (hf_token=..., a password) never does.
    key, sep, _ = arg.partition("=")
    return Location(f"<cli {key}=***>" if sep and is_secret_key(key.strip()) else f"<cli {arg}>")


def _parse_path(dotted: str, arg: str) -> tuple:
    # `data.datasets[0].path`, as errors print keys, is `data.datasets.0.path`
    dotted = re.sub(r"\[(\d+)\](?=\.|$)", r".\1", dotted)
    parts = dotted.split(".")
    if not dotted or not all(p.strip() for p in parts) or any(0xD800 <= ord(c) <= 0xDFFF for c in dotted):
        raise RecipeError("bad key in override", location=_cli_location(arg),
                          hint="keys are dotted names such as train.learning_rate")
    return tuple(int(p) if p.isdecimal() else p for p in parts)


def _parse_value(raw: str, loc: Location):
    if raw.strip() == "":
        return ""
    return load_yaml_value(raw, loc)


def _depth(value: JSONValue) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _set(tree: ConfigTree, path: tuple, value, loc: Location) -> None:
    # Missing or null sections on the way are created (``logging.wandb.project=x`` works with no wandb yet).
    if len(path) + _depth(value) > MAX_DEPTH:
        raise RecipeError(f"nesting deeper than {MAX_DEPTH} levels of mappings and lists", location=loc,
                          hint="a recipe nests a few levels (data.datasets[0].columns); shorten the key or value")
    try:
        tree.set(path, value, loc)
    except (IndexError, TypeError):
        raise RecipeError(f"cannot set '{'.'.join(map(str, path))}': a list index is out of range, or a list "
                          f"is indexed by name", location=loc,
                          hint="lists take numeric indices within range, e.g. data.datasets.0.path=x.jsonl") from None
