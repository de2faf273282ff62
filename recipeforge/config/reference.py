"""docs/recipes.md: the reference of every recipe field, generated from the schema."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from recipeforge.config.schema.recipe import Recipe

from recipeforge.config.schema.stage_recipes import STAGE_CLASSES

_HEADER = """# Recipe reference

Generated from the schema by `recipeforge schema --format markdown`; do not edit by hand.
A recipe is one YAML file. `extends:` names parent recipes (relative paths or
`pkg://<plugin>/<file>.yaml`), merged parent first; `key=value` arguments override any field;
`${section.key}` and `${env:VAR,default}` interpolate; `???` marks a value that must be given.
Unknown keys are errors. `recipeforge schema` prints the JSON Schema for editors
(`# yaml-language-server: $schema=<path to the schema file>`).
"""


def recipe_reference_markdown() -> str:
    """Markdown with one table per section, in recipe order."""
    out = [_HEADER]
    out.append("## Stages\n")
    for stage, cls in STAGE_CLASSES.items():
        extra = [n for n in cls.model_fields if n not in Recipe.model_fields]
        more = f" Adds: {', '.join(f'`{n}:`' for n in extra)}." if extra else ""
        out.append(f"- `stage: {stage}` — {cls.__doc__.strip().splitlines()[0]}{more}")
    out.append("")
    seen: set[type] = set()
    queue: list[tuple[str, type[BaseModel]]] = [("(top level)", Recipe)]
    for stage_cls in STAGE_CLASSES.values():
        for name, field in stage_cls.model_fields.items():
            if name not in Recipe.model_fields:
                queue.append((name, _model_in(field.annotation)))
    while queue:
        title, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out.append(f"## `{title}`\n" if title != "(top level)" else "## Top level\n")
        out.append((model.__doc__ or "").strip().splitlines()[0] + "\n")
        out.append("| key | type | default | description |\n|---|---|---|---|")
        nested = []
        fields = list(model.model_fields.items())
        if model is Recipe:  # stage-only sections are listed at the top level too
            fields += [(n, f) for cls in STAGE_CLASSES.values() for n, f in cls.model_fields.items()
                       if n not in Recipe.model_fields]
        for name, field in fields:
            sub = _model_in(field.annotation)
            if sub is not None and sub not in seen:
                nested.append((f"{title}.{name}" if title != "(top level)" else name, sub))
            description = (field.description or "").replace("|", "\\|")
            if model is Recipe and name not in Recipe.model_fields:
                description += f" Only for `stage: {name}`."
            out.append(f"| `{name}` | {_type(field.annotation)} | {_default(field)} | {description} |")
        out.append("")
        queue = nested + queue
    return "\n".join(out).rstrip() + "\n"


def _model_in(tp: object) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _type(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type(typing.get_args(tp)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return f"list of {_type(typing.get_args(tp)[0])}"
    if origin is dict:
        return f"mapping to {_type(typing.get_args(tp)[1])}"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    return getattr(tp, "__name__", str(tp)).replace("Any", "any")


def _default(field) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "(section defaults)"
    else:
        value = field.default
    if value is PydanticUndefined:
        return "**required**"
    return f"`{json.dumps(value, default=str)}`"
