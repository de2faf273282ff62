"""Safe YAML parsing with line/column provenance for every key.

Only plain YAML data is accepted: mappings with string keys, sequences and scalars. Python tags
(``!!python/object``), custom tags and documents that anchors/aliases would blow up past a
size limit are refused with a located error; loading a recipe never runs code.

Every YAML text a recipe is made of (a file, a parent, a ``key=value`` override, a ``RECIPEFORGE_*``
variable) goes through the same limits, so no later step meets data it cannot handle: nesting at
most `MAX_DEPTH` levels, no alias inside its own anchor (a structure that contains itself), no
string over `MAX_STRING` characters, integers within 64 bits and finite floats.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path as _FsPath
from typing import Any, Iterable

import yaml

from recipeforge.config.tree import ConfigTree
from recipeforge.errors import Location, Problem, RecipeError, format_key

# A recipe is a few hundred nodes; the limit stops "billion laughs" alias bombs long before they
# cost memory, while leaving ample room for big shared bases.
MAX_NODES = 20_000
MAX_BYTES = 2_000_000
# Recipes nest 5-6 levels (data.datasets[0].columns.prompt); deeper nesting is a mistake or an attack
# on the recursive steps that follow (merging, interpolation, validation).
MAX_DEPTH = 32
MAX_STRING = 100_000   # characters in one value; a chat template or a long prompt fits easily
MAX_INT = 2**63 - 1    # what every step count, size and seed fits in
MAX_KEY = 200          # characters in one key name

_SCALAR_TAGS = {
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:timestamp",
}
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def load_yaml_file(path: str | _FsPath, recipe_keys: Iterable[str] | None = None) -> ConfigTree:
    """Read and parse one recipe file; errors point into it. `recipe_keys`: see `load_yaml_text`."""
    path = _FsPath(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {name}", hint="check the path (it is relative to "
                          "the current directory)") from None
    except IsADirectoryError:
        raise RecipeError(f"{name} is a directory, not a recipe file") from None
    except OSError as exc:
        raise RecipeError(f"cannot read {name}: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise RecipeError(f"{name} is {len(raw)} bytes; a recipe may be at most {MAX_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecipeError(f"not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x})",
                          location=Location(name, line, col), hint="save the recipe as UTF-8") from None
    return load_yaml_text(text, name, recipe_keys)


class NotARecipe(RecipeError):
    """A YAML file whose top level is not a recipe's (a list, a scalar, or keys no recipe has)."""


def load_yaml_text(text: str, name: str = "<string>", recipe_keys: Iterable[str] | None = None) -> ConfigTree:
    """Parse YAML text into a `ConfigTree` whose root must be a mapping.

    With `recipe_keys`, a document whose top-level keys are mostly not among them is refused with one
    `NotARecipe` error before anything in it is reported (its contents are never echoed)."""
    root_loc = Location(name, 1, 1)
    node = _compose_one(text, name, "a recipe")
    if node is None:
        return ConfigTree({}, {}, root_loc)
    if recipe_keys is not None:
        _check_recipe_shape(node, name, set(recipe_keys))
    builder = _Builder(name)
    data = builder.build(node, ())
    if builder.problems:
        raise RecipeError(builder.problems)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping of sections (stage:, model:, ...)",
                          location=root_loc)
    return ConfigTree(data, builder.prov, root_loc)


def load_yaml_value(text: str, location: Location) -> Any:
    """Parse one value given outside a file (a ``key=value`` override, an environment variable) under
    the same rules as a recipe file; errors point at `location`."""
    if _has_surrogate(text):
        # Bytes that were not UTF-8 reach Python as lone surrogates (argv, environ).
        raise RecipeError("the value is not UTF-8 text", location=location,
                          hint="write the value in UTF-8 (check the terminal's or the script's encoding)")
    node = _compose_one(text, location.file, "a value", location)
    if node is None:
        return None
    builder = _Builder(location.file, location)
    value = builder.build(node, ())
    if builder.problems:
        raise RecipeError(builder.problems)
    return value


def _compose_one(text: str, name: str, what: str, fixed: Location | None = None) -> yaml.Node | None:
    """The one YAML document in `text` as a node graph (None when empty), after the structural checks."""
    _prescan(text, name, fixed)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, name, fixed) from None
    nodes = [n for n in nodes if n is not None]
    if len(nodes) > 1:
        raise RecipeError(f"{what} holds one YAML document, found several ('---')",
                          location=fixed or _loc(name, nodes[1]),
                          hint="remove the '---' separator and the documents after the first")
    return nodes[0] if nodes else None


def _prescan(text: str, name: str, fixed: Location | None) -> None:
    """Check nesting depth and self-containing aliases on the event stream, which PyYAML produces
    without recursion, before the (recursive) composer and every later step see the document."""
    depth = 0
    open_anchors: list[str | None] = []
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise RecipeError(f"nesting deeper than {MAX_DEPTH} levels of mappings and lists",
                                      location=fixed or _mark(name, event.start_mark),
                                      hint="a recipe nests a few levels (data.datasets[0].columns); flatten this")
                open_anchors.append(event.anchor)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                open_anchors.pop()
            elif isinstance(event, yaml.AliasEvent) and event.anchor in open_anchors:
                raise RecipeError(f"recursive alias *{event.anchor}: it is used inside the &{event.anchor} it "
                                  "refers to, which would make a value that contains itself",
                                  location=fixed or _mark(name, event.start_mark),
                                  hint="an alias may only repeat a value that is complete where it is used")
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text, name, fixed) from None


def _syntax_error(exc: yaml.YAMLError, text: str, name: str, fixed: Location | None) -> RecipeError:
    hint = "check indentation, colons and quoting on this line or the one above"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        loc = fixed or (_mark(name, mark) if mark else Location(name, 1, 1))
        msg = " ".join(x for x in (exc.context, exc.problem) if x) or "invalid YAML"
        if fixed:
            return RecipeError(f"cannot parse the value as YAML: {msg}", location=loc,
                               hint="quote strings with special characters: key='value: with colon'")
        return RecipeError(f"YAML syntax error: {msg}", location=loc, hint=hint)
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: no mark, only a position
        pos = exc.position
        line = text.count("\n", 0, pos) + 1
        loc = fixed or Location(name, line, pos - (text.rfind("\n", 0, pos) + 1) + 1)
        return RecipeError(f"YAML syntax error: control character {chr(exc.character)!r} is not allowed",
                           location=loc, hint="remove it, or write it as an escape inside double quotes")
    return RecipeError("YAML syntax error", location=fixed or Location(name, 1, 1), hint=hint)


def _check_recipe_shape(node: yaml.Node, name: str, recipe_keys: set) -> None:
    # Judged on the node graph, before building: a file that is no recipe (a system file, some other
    # tool's YAML) must fail as a whole, not with one "unknown key" error per line quoting it.
    if not isinstance(node, yaml.MappingNode):
        raise NotARecipe(f"{name} is not a recipe: its top level is not a mapping of recipe sections")
    keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG]
    known = [k for k in keys if k in recipe_keys]
    unknown = len(keys) - len(known)
    if unknown and (not known or unknown > max(3, len(known))):
        raise NotARecipe(f"{name} is not a recipe: {unknown} of its {len(keys)} top-level keys are not recipe "
                         "sections")


def check_finite_numbers(data: object, locate) -> None:
    """Refuse NaN and infinities in validated recipe data (``recipe.model_dump()``): text such as
    ``'1e999'`` or ``'nan'`` given for a number field becomes one only after validation. `locate` maps a
    key path to its `Location`."""
    problems = [Problem(f"{value} is not a finite number", locate(path), format_key(path),
                        hint="write a finite number") for path, value in _float_leaves(data, ())
                if not math.isfinite(value)]
    if problems:
        raise RecipeError(problems)


def _float_leaves(node: object, prefix: tuple):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _float_leaves(v, prefix + (k,))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _float_leaves(v, prefix + (i,))
    elif isinstance(node, float):
        yield prefix, node


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def _loc(name: str, node: yaml.Node) -> Location:
    return _mark(name, node.start_mark)


def _mark(name: str, mark) -> Location:
    return Location(name, mark.line + 1, mark.column + 1)


class _Builder:
    """Turns composed YAML nodes into plain data, recording provenance and refusing unsafe input."""

    def __init__(self, name: str, fixed: Location | None = None):
        self.name = name
        self.fixed = fixed  # one location for everything (an override has no lines)
        self.prov: dict = {}
        self.problems: list[Problem] = []
        self.count = 0
        self.constructor = yaml.SafeLoader("")  # only used for its scalar constructors

    def loc(self, node: yaml.Node) -> Location:
        return self.fixed or _loc(self.name, node)

    def build(self, node: yaml.Node, path: tuple, depth: int = 0):
        self.count += 1
        if self.count > MAX_NODES:
            raise RecipeError(
                f"document expands to more than {MAX_NODES} nodes (anchors/aliases?); refusing to load it",
                location=self.loc(node),
                hint="recipes share values with `extends:` and ${...} interpolation; avoid alias bombs")
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            depth += 1
            if depth > MAX_DEPTH:  # reached through aliases of aliases; the text itself was checked
                raise RecipeError(f"nesting deeper than {MAX_DEPTH} levels of mappings and lists (through "
                                  "aliases)", location=self.loc(node), key=format_key(path) or None)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                return self._bad_tag(node, path)
            return [self._child(item, path + (i,), item, depth) for i, item in enumerate(node.value)]
        if node.tag not in _SCALAR_TAGS:
            return self._bad_tag(node, path)
        return self._scalar(node, path)

    def _scalar(self, node: yaml.ScalarNode, path: tuple):
        text = node.value
        if len(text) > MAX_STRING:
            return self._problem(f"value of {len(text)} characters; at most {MAX_STRING} are allowed", node, path,
                                 "keep long text (prompts, templates) in a file and name the file")
        if _has_surrogate(text):  # "\ud800" escapes: text no file or terminal can hold
            return self._problem("the value holds a lone surrogate escape (\\ud800-\\udfff), which is not text",
                                 node, path, "write the character itself, or a valid \\U escape")
        if node.tag == "tag:yaml.org,2002:int" and len(text.lstrip("+-").replace("_", "")) > 30:
            # Checked on the text: Python refuses to convert integers of thousands of digits at all.
            return self._problem("integer too large", node, path, "write a number below 2**63")
        value = self.constructor.construct_object(node, deep=True)
        if isinstance(value, (_dt.date, _dt.datetime)):
            value = text  # dates stay text (e.g. revisions), never Python objects
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            return self._problem(f"integer too large ({len(str(abs(value)))} digits)", node, path,
                                 "write a number below 2**63")
        elif isinstance(value, float) and not math.isfinite(value):
            return self._problem(f"{text!r} is not a finite number", node, path,
                                 "write a finite number; quote it ('nan') if text is meant")
        return value

    def _problem(self, message: str, node: yaml.Node, path: tuple, hint: str):
        self.problems.append(Problem(message, self.loc(node), format_key(path) or None, hint=hint))
        return None

    def _child(self, node, path, mark_node, depth):
        self.prov[path] = self.loc(mark_node)
        return self.build(node, path, depth)

    def _mapping(self, node: yaml.MappingNode, path: tuple, depth: int) -> dict:
        if node.tag != _MAP_TAG:
            return self._bad_tag(node, path)
        out: dict = {}
        seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # YAML merge key `<<: *base`
                for src in (value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]):
                    merged = self.build(src, path, depth - 1)
                    if not isinstance(merged, dict):
                        self.problems.append(Problem("`<<` merge needs a mapping", self.loc(src),
                                                     format_key(path) or None))
                        continue
                    for k, v in merged.items():
                        out.setdefault(k, v)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                self.problems.append(Problem(
                    "keys must be plain strings", self.loc(key_node), format_key(path) or None,
                    hint="quote the key, e.g. '1': value"))
                continue
            key = key_node.value
            kpath = path + (key,)
            if _has_surrogate(key) or len(key) > MAX_KEY:
                self.problems.append(Problem("keys are short names of text", self.loc(key_node),
                                             format_key(path) or None, hint="rename the key"))
                continue
            if key in seen:
                self.problems.append(Problem(
                    f"duplicate key '{key}' (first written at line {seen[key].line})",
                    self.loc(key_node), format_key(kpath), hint="remove one of the two"))
                continue
            seen[key] = self.loc(key_node)
            self.prov[kpath] = seen[key]
            out[key] = self.build(value_node, kpath, depth)
        return out

    def _bad_tag(self, node: yaml.Node, path: tuple):
        tag = node.tag
        if tag.startswith("tag:yaml.org,2002:python/"):
            msg = f"refusing Python tag !!{tag[len('tag:yaml.org,2002:'):]}: recipes are data and never run code"
        else:
            msg = f"unsupported YAML tag {tag!r}: recipes hold plain mappings, lists and scalars"
        self.problems.append(Problem(msg, self.loc(node), format_key(path) or None,
                                     hint="remove the tag"))
        return None
