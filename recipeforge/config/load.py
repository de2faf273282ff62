"""Safe YAML parsing with line/column provenance for every key.

Only plain YAML data is accepted: mappings with string keys, sequences and scalars. Python tags
(``!!python/object``), custom tags and documents that anchors/aliases would blow up past a
size limit are refused with a located error; loading a recipe never runs code.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path as _FsPath

import yaml

from recipeforge.config.tree import ConfigTree
from recipeforge.errors import Location, Problem, RecipeError, format_key

# A recipe is a few hundred nodes; the limit stops "billion laughs" alias bombs long before they
# cost memory, while leaving ample room for big shared bases.
MAX_NODES = 20_000
MAX_BYTES = 2_000_000

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


def load_yaml_file(path: str | _FsPath) -> ConfigTree:
    """Read and parse one recipe file; errors point into it."""
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
        raise RecipeError(f"{name} is not UTF-8 text (byte {exc.start})",
                          hint="save the recipe as UTF-8") from None
    return load_yaml_text(text, name)


def load_yaml_text(text: str, name: str = "<string>") -> ConfigTree:
    """Parse YAML text into a `ConfigTree` whose root must be a mapping."""
    root_loc = Location(name, 1, 1)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Location(name, mark.line + 1, mark.column + 1) if mark else root_loc
        msg = " ".join(x for x in (exc.context, exc.problem) if x) or "invalid YAML"
        raise RecipeError(f"YAML syntax error: {msg}", location=loc,
                          hint="check indentation, colons and quoting on this line or the one above") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"YAML error: {exc}", location=root_loc) from None
    nodes = [n for n in nodes if n is not None]
    if not nodes:
        return ConfigTree({}, {}, root_loc)
    if len(nodes) > 1:
        raise RecipeError("a recipe holds one YAML document, found several ('---')",
                          location=_loc(name, nodes[1]))
    builder = _Builder(name)
    data = builder.build(nodes[0], ())
    if builder.problems:
        raise RecipeError(builder.problems)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError("a recipe must be a mapping of sections (stage:, model:, ...)",
                          location=root_loc)
    return ConfigTree(data, builder.prov, root_loc)


def _loc(name: str, node: yaml.Node) -> Location:
    return Location(name, node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns composed YAML nodes into plain data, recording provenance and refusing unsafe input."""

    def __init__(self, name: str):
        self.name = name
        self.prov: dict = {}
        self.problems: list[Problem] = []
        self.count = 0
        self.constructor = yaml.SafeLoader("")  # only used for its scalar constructors

    def build(self, node: yaml.Node, path: tuple):
        self.count += 1
        if self.count > MAX_NODES:
            raise RecipeError(
                f"document expands to more than {MAX_NODES} nodes (anchors/aliases?); refusing to load it",
                location=_loc(self.name, node),
                hint="recipes share values with `extends:` and ${...} interpolation; avoid alias bombs")
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _SEQ_TAG:
                return self._bad_tag(node, path)
            return [self._child(item, path + (i,), item) for i, item in enumerate(node.value)]
        if node.tag not in _SCALAR_TAGS:
            return self._bad_tag(node, path)
        value = self.constructor.construct_object(node, deep=True)
        if isinstance(value, (_dt.date, _dt.datetime)):
            value = node.value  # dates stay text (e.g. revisions), never Python objects
        return value

    def _child(self, node, path, mark_node):
        self.prov[path] = _loc(self.name, mark_node)
        return self.build(node, path)

    def _mapping(self, node: yaml.MappingNode, path: tuple) -> dict:
        if node.tag != _MAP_TAG:
            return self._bad_tag(node, path)
        out: dict = {}
        seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # YAML merge key `<<: *base`
                for src in (value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]):
                    merged = self.build(src, path)
                    if not isinstance(merged, dict):
                        self.problems.append(Problem("`<<` merge needs a mapping", _loc(self.name, src),
                                                     format_key(path) or None))
                        continue
                    for k, v in merged.items():
                        out.setdefault(k, v)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                self.problems.append(Problem(
                    "keys must be plain strings", _loc(self.name, key_node), format_key(path) or None,
                    hint="quote the key, e.g. '1': value"))
                continue
            key = key_node.value
            kpath = path + (key,)
            if key in seen:
                self.problems.append(Problem(
                    f"duplicate key '{key}' (first written at line {seen[key].line})",
                    _loc(self.name, key_node), format_key(kpath), hint="remove one of the two"))
                continue
            seen[key] = _loc(self.name, key_node)
            self.prov[kpath] = seen[key]
            out[key] = self.build(value_node, kpath)
        return out

    def _bad_tag(self, node: yaml.Node, path: tuple):
        tag = node.tag
        if tag.startswith("tag:yaml.org,2002:python/"):
            msg = f"refusing Python tag !!{tag[len('tag:yaml.org,2002:'):]}: recipes are data and never run code"
        else:
            msg = f"unsupported YAML tag {tag!r}: recipes hold plain mappings, lists and scalars"
        self.problems.append(Problem(msg, _loc(self.name, node), format_key(path) or None,
                                     hint="remove the tag"))
        return None
