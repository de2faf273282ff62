"""Validation of a resolved tree into a typed `Recipe`, with every problem located and hinted.

`model_problems` gives plugin schemas (kernel options, reward args, rollout options) the same
messages as the core schema; `check_components` checks the reward names of a recipe against this
environment.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from recipeforge.config.schema.recipe import (STAGE_CLASSES, STAGE_ONLY_SECTIONS, STAGES, Recipe,
                                              recipe_adapter)
from recipeforge.config.schema.rules import RuleProblem, RuleViolations
from recipeforge.config.tree import ConfigTree
from recipeforge.errors import Problem, RecipeError, did_you_mean, format_key, sort_problems

_KINDS = {
    "int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
    "list": "a list", "tuple": "a list", "dict": "a mapping", "model": "a mapping", "none": "null",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def validate_tree(tree: ConfigTree) -> Recipe:
    """Validate `tree` against the recipe schema; raise `RecipeError` listing all problems."""
    try:
        return recipe_adapter().validate_python(tree.data)
    except RuleViolations as exc:
        raise RecipeError(sort_problems([Problem(p.message, tree.locate(p.path), format_key(p.path), p.hint)
                                   for p in exc.problems])) from None
    except ValidationError as exc:
        errors = exc.errors()
    problems: list[Problem] = []
    stage = tree.data.get("stage")
    if errors and errors[0]["type"] in ("union_tag_invalid", "union_tag_not_found", "model_attributes_type"):
        problems.append(_stage_problem(tree, stage))
        # Still check the rest against the closest stage, so the user sees every problem at once.
        guess = (did_you_mean(str(stage), STAGES) or "'sft'").split("'")[1] if stage is not None else "sft"
        if isinstance(tree.data, dict):
            try:
                STAGE_CLASSES[guess].model_validate({**tree.data, "stage": guess})
            except ValidationError as inner:
                problems.extend(_problems(inner.errors(), tree, STAGE_CLASSES[guess], strip_tag=False))
            except RuleViolations:
                pass
    else:
        cls = STAGE_CLASSES.get(stage, Recipe)
        problems.extend(_problems(errors, tree, cls, strip_tag=True))
    raise RecipeError(sort_problems(problems)) from None


def _stage_problem(tree: ConfigTree, stage: Any) -> Problem:
    if stage is None:
        return Problem("required key 'stage' is missing", tree.root, "stage",
                       hint=f"add `stage: <one of {', '.join(STAGES)}>`")
    return Problem(f"must be one of {', '.join(STAGES)} (got {stage!r})", tree.locate(("stage",)), "stage",
                   hint=did_you_mean(str(stage), STAGES))


def _problems(errors: list[dict], tree: ConfigTree, cls: type[BaseModel], strip_tag: bool) -> list[Problem]:
    return [Problem(message, tree.locate(path), format_key(path), hint)
            for path, message, hint in _described(errors, cls, strip_tag)]


def _described(errors: list[dict], cls: type[BaseModel], strip_tag: bool) -> list[tuple[tuple, str, str | None]]:
    """pydantic errors of `cls` as (user key path, message, hint), one per key (union alternatives merged)."""
    grouped: dict[tuple, list[dict]] = {}
    for err in errors:
        loc = tuple(err["loc"])
        if strip_tag and loc and loc[0] in STAGES:
            loc = loc[1:]
        path, parent = _schema_path(cls, loc)
        grouped.setdefault(path, []).append({**err, "_parent": parent, "_full": loc})
    out = []
    for path, errs in grouped.items():
        # A list whose items failed also reports "too short" (no valid items); the item errors say it all.
        errs = [e for e in errs if not (e["type"] == "too_short" and any(
            p[:len(path)] == path and len(p) > len(path) for p in grouped))] or errs
        if all(e["type"] == "too_short" for e in errs) and any(
                p[:len(path)] == path and len(p) > len(path) for p in grouped):
            continue
        out.append((path, *(_union_message(path, errs) if len(errs) > 1 else _message(path, errs[0]))))
    return out


def model_problems(model: type[BaseModel], data: Any, prefix: tuple) -> list[RuleProblem]:
    """`data` validated against a plugin's pydantic model; its errors as rule problems at `prefix` + key.

    This is how a plugin's own schema (kernel options, reward args, rollout options) extends the
    recipe: the core classes stay as they are, and the plugin's errors read like the core's.
    """
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [RuleProblem(prefix + path, message, hint)
                for path, message, hint in _described(exc.errors(), model, strip_tag=False)]
    except Exception as exc:  # a plugin's validator that raises something else: its bug, reported here
        return [RuleProblem(prefix, f"the plugin's schema failed on these settings: {type(exc).__name__}: {exc}",
                            "report it to the plugin's authors")]
    return []


def check_components(loaded: Any) -> None:
    """Check that every reward a recipe names exists here (built in, or from an installed plugin).

    Loading a recipe checks formats, kernels, rollout engines, the code opt-in and every plugin's
    options; reward names are checked here instead, so that a recipe loads (resolve, inspect) where its
    reward plugin is not installed. The CLI's `validate`, `plan` and `train` call this; training checks
    the rewards again when it builds them. `loaded` is a `LoadedRecipe` (or a bare `Recipe`).
    """
    from recipeforge.components.rewards import rewards
    from recipeforge.registry import is_code_reference

    recipe = getattr(loaded, "recipe", loaded)
    tree = getattr(loaded, "tree", None)
    problems: list[Problem] = []
    for i, spec in enumerate(getattr(getattr(recipe, "grpo", None), "rewards", ())):
        if is_code_reference(spec.name) or rewards.has(spec.name):
            continue
        path = ("grpo", "rewards", i, "name")
        err = rewards.unknown(spec.name, key=format_key(path), location=tree.locate(path) if tree else None)
        problems.extend(err.problems)
    if problems:
        raise RecipeError(sort_problems(problems))


def _message(path: tuple, err: dict) -> tuple[str, str | None]:
    """The message and hint of one pydantic error at the user key `path`."""
    kind = err["type"]
    ctx, value = err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        name = path[-1]
        parent_fields = list(getattr(err["_parent"], "model_fields", {}) or {})
        hint = did_you_mean(str(name), parent_fields)
        if len(path) == 1 and name in STAGE_ONLY_SECTIONS:
            hint = f"the '{name}:' section applies only to stage: {STAGE_ONLY_SECTIONS[name]}"
        elif hint is None and parent_fields:
            hint = f"allowed keys here: {', '.join(parent_fields)}"
        elif hint is None:
            hint = "this takes no options"
        return f"unknown key '{name}'", hint
    if kind == "missing":
        return (f"required key '{path[-1]}' is missing",
                _description(err["_parent"], path[-1]) or "add it to the recipe")
    if kind in ("literal_error", "enum"):
        choices = _choices(ctx.get("expected", ""))
        return f"must be one of {', '.join(choices)} (got {value!r})", did_you_mean(str(value), choices)
    if kind in _BOUNDS:
        return f"must be {_BOUNDS[kind]} {_num(next(iter(ctx.values())))} (got {value!r})", None
    if kind in ("too_short", "too_long"):
        return _lower(err["msg"]), "add at least one entry" if kind == "too_short" else None
    if kind.split("_")[0] in _KINDS or kind.endswith("_type") or kind.endswith("_parsing"):
        expected = _KINDS.get(kind.split("_")[0], kind.replace("_", " "))
        return (f"expected {expected} (got {_describe(value)})",
                _description(err["_parent"], path[-1]) if path else None)
    if kind == "value_error":  # raised by our own validators: the message is already for users
        return str(ctx.get("error", err["msg"])), None
    return f"{_lower(err['msg'])} (got {_describe(value)})", None


def _union_message(path: tuple, errs: list[dict]) -> tuple[str, str | None]:
    options = []
    for err in errs:
        kind, ctx = err["type"], err.get("ctx") or {}
        if kind == "literal_error":
            options.extend(_choices(ctx.get("expected", "")))
        elif kind in _BOUNDS:
            options.append(f"a number {_BOUNDS[kind]} {_num(next(iter(ctx.values())))}")
        else:
            options.append(_KINDS.get(kind.split("_")[0], _lower(err["msg"])))
    options = list(dict.fromkeys(options))
    value = errs[0].get("input")
    return (f"expected {' or '.join(options)} (got {_describe(value)})",
            _description(errs[0]["_parent"], path[-1]) if path else None)


def _schema_path(cls: type[BaseModel], loc: tuple) -> tuple[tuple, type | None]:
    """Follow `loc` through the schema; stop at union member labels pydantic inserts.

    Returns the user-facing key path and the model class that owns its last key.
    """
    path: list = []
    current: Any = cls
    parent: Any = None
    for part in loc:
        current = _unwrap_optional(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            parent = current
            path.append(part)
            field = current.model_fields.get(part) if isinstance(part, str) else None
            current = field.annotation if field is not None else None
            continue
        origin = typing.get_origin(current)
        if origin in (tuple, list) and isinstance(part, int):
            path.append(part)
            current = typing.get_args(current)[0]
            continue
        if origin is dict:
            path.append(part)
            current = typing.get_args(current)[1]
            continue
        if _is_union(current):
            break  # `part` is a union member label, not a key
        path.append(part)
        current = None
    return tuple(path), parent


def _unwrap_optional(tp: Any) -> Any:
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if _is_union(tp):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _description(model: Any, name: Any) -> str | None:
    field = getattr(model, "model_fields", {}).get(name) if model is not None else None
    return field.description if field is not None else None


def _choices(expected: str) -> list[str]:
    # pydantic renders expectations as "'a', 'b' or 'c'"
    return [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(",") if c.strip()]


def _describe(value: Any) -> str:
    text = repr(value)
    if isinstance(value, (dict, list)):
        text = "a mapping" if isinstance(value, dict) else "a list"
    return text if len(text) <= 60 else text[:57] + "..."


def _num(bound: Any) -> Any:
    return int(bound) if isinstance(bound, float) and bound.is_integer() else bound


def _lower(msg: str) -> str:
    return msg[:1].lower() + msg[1:]
