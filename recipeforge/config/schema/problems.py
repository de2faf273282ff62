"""pydantic errors as the user reads them: one (key path, message, hint) per key.

`described` follows each error's location through the schema (stopping at the union member labels
pydantic inserts), merges the alternatives of a union into one message and adds did-you-mean hints.
`RuleProblem` is the same triple for the checks that run on a built `Recipe` (`rules.py`,
`components.py`); `config.validate` locates both in the recipe file.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from recipeforge.config.schema.recipe import STAGES
from recipeforge.config.schema.stage_recipes import STAGE_ONLY_SECTIONS
from recipeforge.errors import did_you_mean

_KINDS = {
    "int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
    "list": "a list", "tuple": "a list", "dict": "a mapping", "model": "a mapping", "none": "null",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


@dataclass(frozen=True)
class RuleProblem:
    """A problem at a key path of the recipe (located in the recipe file by `config.validate`)."""

    path: tuple
    message: str
    hint: str | None = None


def described(errors: list[dict], cls: type[BaseModel], strip_tag: bool) -> list[tuple[tuple, str, str | None]]:
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


def model_problems(model: type[BaseModel], data: object, prefix: tuple) -> list[RuleProblem]:
    """`data` validated against a plugin's pydantic model; its errors as rule problems at `prefix` + key.

    This is how a plugin's own schema (kernel options, reward args, rollout options) extends the
    recipe: the core classes stay as they are, and the plugin's errors read like the core's.
    """
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [RuleProblem(prefix + path, message, hint)
                for path, message, hint in described(exc.errors(), model, strip_tag=False)]
    except Exception as exc:  # a plugin's validator that raises something else: its bug, reported here
        return [RuleProblem(prefix, f"the plugin's schema failed on these settings: {type(exc).__name__}: {exc}",
                            "report it to the plugin's authors")]
    return []


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


def _unwrap_optional(tp: object) -> Any:
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


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _description(model: type[BaseModel] | None, name: str | int) -> str | None:
    field = getattr(model, "model_fields", {}).get(name) if model is not None else None
    return field.description if field is not None else None


def _choices(expected: str) -> list[str]:
    # pydantic renders expectations as "'a', 'b' or 'c'"
    return [c.strip().strip("'") for c in expected.replace(" or ", ", ").split(",") if c.strip()]


def _describe(value: object) -> str:
    text = repr(value)
    if isinstance(value, (dict, list)):
        text = "a mapping" if isinstance(value, dict) else "a list"
    return text if len(text) <= 60 else text[:57] + "..."


def _num(bound: object) -> object:
    return int(bound) if isinstance(bound, float) and bound.is_integer() else bound


def _lower(msg: str) -> str:
    return msg[:1].lower() + msg[1:]
