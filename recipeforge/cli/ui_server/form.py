"""The editor's form: the recipe's JSON Schema (what `recipeforge schema` prints) turned into fields, and a
value the form sends typed by its field's schema.

The schema is a union over stages; the form of a recipe is the one of its own `stage`. Each top-level
section (model, data, train, ...) is a group; the top level's own values (stage, name, ...) are a group
too. A field is a choice (`enum`, also a boolean that may be null), a `boolean`, an `integer` or `number`,
a `string`, or `text` where the schema allows several kinds (``auto`` or a number): the server types what
is typed there. A list or a mapping is `readonly` (the YAML view edits it). `$ref`s are followed and an
``anyOf`` with null makes the field optional (`nullable`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from recipeforge.cli.mcp_server.records import Record
from recipeforge.cli.ui_server.yaml_edit import Scalar
from recipeforge.errors import RecipeError

KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INT = re.compile(r"^[-+]?[0-9]+$")
MAX_INT = 2**63 - 1
MAX_DEPTH = 8
SCALAR_TYPES = ("string", "integer", "number", "boolean")
TOP = "recipe"  # the group of the top level's own values


@dataclass(frozen=True)
class Field:
    """One form field (or a group of them) at dotted `key`."""

    key: str
    kind: str  # group, enum, boolean, integer, number, string, text, readonly
    help: str = ""
    title: str = ""
    nullable: bool = False
    default: Any = None
    options: tuple[Scalar, ...] = ()
    types: frozenset[str] = frozenset()
    fields: tuple["Field", ...] = ()
    note: str = ""

    def record(self) -> Record:
        """The field as the page reads it."""
        out: Record = {"key": self.key, "name": self.key.rsplit(".", 1)[-1] if self.key else TOP, "kind": self.kind,
                       "help": self.help, "title": self.title, "nullable": self.nullable}
        if self.kind == "group":
            out["fields"] = [f.record() for f in self.fields]
        else:
            out["default"] = self.default
            if self.options:
                out["options"] = list(self.options)
            if self.note:
                out["note"] = self.note
        return out


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    from recipeforge.config.jsonschema import recipe_json_schema

    return recipe_json_schema()


def stages() -> list[str]:
    """The stages the schema knows, in its order."""
    return list(_schema()["discriminator"]["mapping"])


@functools.lru_cache(maxsize=32)
def stage_form(stage: str) -> tuple[Field, ...]:
    """The form of a recipe of `stage`: the top level's own values, then one group per section."""
    schema = _schema()
    ref = schema["discriminator"]["mapping"].get(stage)
    if ref is None:
        raise RecipeError(f"stage {stage!r} is not a stage the schema knows", key="stage",
                          hint="one of: " + ", ".join(stages()))
    recipe = _deref(schema, {"$ref": ref})
    top: list[Field] = []
    groups: list[Field] = []
    for name, prop in recipe.get("properties", {}).items():
        if name == "stage":
            top.append(Field("stage", "enum", help=prop.get("description", ""), title="Stage", default=stage,
                             options=tuple(stages()), types=frozenset({"string"})))
            continue
        made = _field(schema, name, prop, 1)
        (groups if made.kind == "group" else top).append(made)
    return (Field("", "group", help="The recipe's own values.", title="Recipe", fields=tuple(top)), *groups)


@functools.lru_cache(maxsize=32)
def field_index(stage: str) -> dict[str, Field]:
    """Every field of `stage`'s form by dotted key (groups included)."""
    out: dict[str, Field] = {}

    def walk(fields: tuple[Field, ...]) -> None:
        for f in fields:
            if f.key:
                out[f.key] = f
            walk(f.fields)

    walk(stage_form(stage))
    return out


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` with its `$ref` (into ``#/$defs/``) followed; the referring node's description wins."""
    seen = 0
    while "$ref" in node and seen < MAX_DEPTH:
        target = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        seen += 1
    return node


def _branches(schema: dict[str, Any], prop: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The alternatives of `prop` (anyOf/oneOf flattened, `$ref`s followed) without null, and whether null
    is one of them."""
    out: list[dict[str, Any]] = []
    nullable = False
    todo = [_deref(schema, prop)]
    while todo:
        node = todo.pop(0)
        alternatives = node.get("anyOf") or node.get("oneOf")
        if alternatives:
            todo[:0] = [_deref(schema, a) for a in alternatives]
        elif node.get("type") == "null":
            nullable = True
        else:
            out.append(node)
    return out, nullable


def _field(schema: dict[str, Any], key: str, prop: dict[str, Any], depth: int) -> Field:
    branches, nullable = _branches(schema, prop)
    help_text = prop.get("description") or next((b.get("description", "") for b in branches), "")
    common = {"help": help_text, "title": prop.get("title", ""), "nullable": nullable}
    default = prop.get("default")
    objects = [b for b in branches if b.get("type") in ("object", "array") or "properties" in b or "items" in b]
    if len(branches) == 1 and "properties" in branches[0] and depth < MAX_DEPTH:
        children = tuple(_field(schema, f"{key}.{name}", p, depth + 1)
                         for name, p in branches[0]["properties"].items())
        return Field(key, "group", fields=children, **common)
    if objects or not branches:
        what = "a list" if any(b.get("type") == "array" for b in objects) else "a mapping"
        return Field(key, "readonly", default=default, note=f"{what}: edit it in the YAML view", **common)
    options: list[Scalar] = []
    types: set[str] = set()
    for b in branches:
        if "const" in b:
            options.append(b["const"])
        elif "enum" in b:
            options.extend(b["enum"])
        elif b.get("type") in SCALAR_TYPES:
            types.add(b["type"])
    if "boolean" in types and (options or nullable):  # auto | true | false: one choice
        options += [True, False]
        types.discard("boolean")
    if options and not types:
        kind = "enum"
    elif types == {"boolean"}:
        kind = "boolean"
    elif not options and types and types <= {"integer", "number"}:
        kind = "number" if "number" in types else "integer"
    elif not options and types == {"string"}:
        kind = "string"
    else:
        kind = "text"
    scalar_types = frozenset(types | {type_name(o) for o in options})
    return Field(key, kind, default=default, options=tuple(options), types=scalar_types, **common)


def type_name(value: object) -> str:
    """The JSON Schema type of a scalar."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "null" if value is None else "string"


def parse_key(key: object) -> tuple[str, ...]:
    """A dotted key the page sent, as its parts (each a plain name)."""
    if not isinstance(key, str) or not key or len(key) > 300:
        raise RecipeError("no key given", key="key", hint="a dotted key such as train.learning_rate")
    parts = tuple(key.split("."))
    if not all(KEY_PART.match(p) for p in parts):
        raise RecipeError(f"{key[:80]!r} is not a dotted key", key="key",
                          hint="names of letters, digits and '_' joined by '.', e.g. train.learning_rate")
    return parts


def typed(f: Field, value: object) -> Scalar:
    """`value` (from the page) as the data `f` holds: text is read as a number, a boolean or null only where
    the field's schema allows one, and is never evaluated. A value of the wrong kind stays as given, for
    validation to report at its line."""
    if isinstance(value, (list, dict)):
        raise RecipeError(f"{f.key}: the form sets one value, not a list or mapping", key=f.key,
                          hint="edit lists and mappings in the YAML view")
    if value is None or (isinstance(value, str) and not value.strip() and "string" not in f.types):
        if f.nullable:
            return None
        raise RecipeError(f"{f.key} needs a value", key=f.key,
                          hint=f"the default is {f.default!r}" if f.default is not None else None)
    if isinstance(value, float) and value.is_integer() and "integer" in f.types and "number" not in f.types:
        return int(value)
    if not isinstance(value, str):
        assert isinstance(value, (bool, int, float))
        if type_name(value) in f.types or (type_name(value) == "integer" and "number" in f.types):
            return value
        return str(value) if "string" in f.types else value
    if value in f.options:
        return value
    text = value.strip()
    if "boolean" in f.types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "integer" in f.types or "number" in f.types:
        if INT.match(text) and abs(int(text)) <= MAX_INT:
            return int(text)
        if "number" in f.types:
            try:
                number = float(text)
            except ValueError:
                number = None
            if number is not None and number == number and abs(number) != float("inf") and text.lower() not in (
                    "nan", "inf", "-inf", "+inf", "infinity", "-infinity"):
                return number
    if f.nullable and text in ("null", "~"):
        return None
    return value
