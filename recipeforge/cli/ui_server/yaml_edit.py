"""Setting one dotted key in a recipe's YAML text, changing as little of the text as possible.

PyYAML does not keep comments when it writes a document, so the text is edited in place instead: when the
key is there, only its value is replaced (the rest of its line, a trailing comment included, stays); when
it is not, one line per missing level is inserted after the last entry of the deepest mapping that is
there (the file's own indentation), or at the end of the file for a new section. Every other character
of the text stays as it was. The new text is read back with the recipe loader and must hold exactly the
old data with that one key set, else the edit is refused: a value can never add, remove or change any
other key (a newline or ``: `` inside a value is written as an escape in a quoted scalar).
"""

from __future__ import annotations

import json
import math
import re

import yaml

from recipeforge.errors import Location, RecipeError
from recipeforge.json_value import JSONValue

Scalar = str | int | float | bool | None

# A plain (unquoted) scalar is written only for text that cannot be read as anything else or start YAML
# syntax; anything else is double-quoted with escapes.
PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_./+@-]*(:[A-Za-z0-9_./+@-]+)*$")
NULL_TEXTS = {"", "~", "null", "Null", "NULL"}
INDENT = 2


def render_scalar(value: Scalar) -> str:
    """`value` as one YAML scalar that reads back as exactly `value` (type included)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RecipeError(f"{value} is not a finite number", hint="give a finite number")
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        # YAML 1.1 (PyYAML) reads 1e-05 as text: its floats need a '.' in the mantissa.
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    if PLAIN.match(value) and yaml.safe_load(value) == value:
        return value
    return quoted(value)


def quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar on one line: quotes, backslashes, line breaks and characters
    a YAML stream may not hold are escapes."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif 0xD800 <= code <= 0xDFFF:
            raise RecipeError("the value is not UTF-8 text", hint="write the value in UTF-8")
        elif code < 0x20 or 0x7F <= code <= 0x9F or ch in "\u2028\u2029\ufeff" or code in (0xFFFE, 0xFFFF):
            out.append(f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def set_key(text: str, path: tuple[str, ...], value: Scalar, name: str) -> str:
    """`text` (a recipe file named `name`) with `path` set to `value`; `RecipeError` when the text does not
    parse, or when a key on the way holds something other than a mapping."""
    from recipeforge.config.load import load_yaml_text

    before = load_yaml_text(text, name).data  # a syntax error: located, before anything is edited
    rendered = render_scalar(value)
    newline = "\r\n" if "\r\n" in text else "\n"
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        edited = _append(text, _block(path, rendered, 0, newline), newline)
    elif isinstance(root, yaml.MappingNode):
        edited = _set_in(text, root, path, 0, rendered, newline, name)
    else:
        raise RecipeError("a recipe must be a mapping of sections", location=Location(name, 1, 1))
    after = load_yaml_text(edited, name).data
    expected = json.loads(json.dumps(before, default=str))
    node = expected
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value
    if _canonical(after) != _canonical(expected):
        # An anchor, an alias or a merge key shares this value with other keys: the text cannot be edited
        # in place without changing them too.
        raise RecipeError(f"{'.'.join(path)} cannot be set in place in this file (an anchor, alias or merge "
                          "key shares it)", key=".".join(path), hint="edit it in the YAML view")
    return edited


def _canonical(data: JSONValue) -> str:
    return json.dumps(data, sort_keys=True, default=str)


def _set_in(text: str, mapping: yaml.MappingNode, path: tuple[str, ...], depth: int, rendered: str,
            newline: str, name: str) -> str:
    part = path[depth]
    for key_node, value_node in mapping.value:
        if not (isinstance(key_node, yaml.ScalarNode) and key_node.value == part):
            continue
        if depth == len(path) - 1:
            return _replace_value(text, key_node, value_node, rendered, path, name)
        if isinstance(value_node, yaml.MappingNode):
            return _set_in(text, value_node, path, depth + 1, rendered, newline, name)
        if _is_null(value_node):
            # `train:` (or `train: null`): the value goes, the missing keys follow on new lines below it.
            start, end = value_node.start_mark.index, value_node.end_mark.index
            if end > start:
                text = text[:start] + text[end:]
            column = key_node.start_mark.column + INDENT
            return _insert_after(text, key_node.end_mark.index, _block(path[depth + 1:], rendered, column, newline),
                                 newline)
        where = Location(name, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        raise RecipeError(f"{'.'.join(path[:depth + 1])} is not a mapping in this file", location=where,
                          key=".".join(path[:depth + 1]), hint="fix it in the YAML view")
    rest = path[depth:]
    if mapping.flow_style:
        close = mapping.end_mark.index - 1  # the '}'
        entry = _flow(rest, rendered)
        return text[:close] + (", " if mapping.value else "") + entry + text[close:]
    column = mapping.value[0][0].start_mark.column
    return _insert_after(text, _content_end(mapping), _block(rest, rendered, column, newline), newline)


def _replace_value(text: str, key_node: yaml.Node, value_node: yaml.Node, rendered: str, path: tuple[str, ...],
                   name: str) -> str:
    if isinstance(value_node, yaml.ScalarNode) and value_node.value == "" and value_node.style is None:
        at = key_node.end_mark.index  # `key:` with nothing after it
        colon = text.index(":", at)
        return text[:colon + 1] + " " + rendered + text[colon + 1:]
    if isinstance(value_node, yaml.ScalarNode) or getattr(value_node, "flow_style", False):
        start, end = value_node.start_mark.index, _content_end(value_node)
        return text[:start] + rendered + text[end:]
    where = Location(name, key_node.start_mark.line + 1, key_node.start_mark.column + 1)
    raise RecipeError(f"{'.'.join(path)} holds a list or mapping in this file", location=where,
                      key=".".join(path), hint="edit it in the YAML view")


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.style is None and node.value in NULL_TEXTS


def _content_end(node: yaml.Node) -> int:
    """Where `node`'s own text ends (a block collection's end mark lies past the comments after it)."""
    if isinstance(node, yaml.ScalarNode):
        end = node.end_mark.index
        if node.style in ("|", ">"):  # a block scalar's end mark is past its trailing line breaks
            while end > node.start_mark.index and node.end_mark.buffer[end - 1] in " \t\r\n":
                end -= 1
        return int(end)
    if getattr(node, "flow_style", False) or not node.value:
        return int(node.end_mark.index)
    last = node.value[-1]
    return _content_end(last[1] if isinstance(node, yaml.MappingNode) else last)


def _insert_after(text: str, index: int, lines: str, newline: str) -> str:
    """`lines` inserted at the start of the line after the one holding `index`."""
    end = text.find("\n", index)
    if end == -1:
        return _append(text, lines, newline)
    return text[:end + 1] + lines + text[end + 1:]


def _append(text: str, lines: str, newline: str) -> str:
    return text + ("" if not text or text.endswith("\n") else newline) + lines


def _block(path: tuple[str, ...], rendered: str, column: int, newline: str) -> str:
    out = [" " * (column + INDENT * i) + part + ":" for i, part in enumerate(path[:-1])]
    out.append(" " * (column + INDENT * (len(path) - 1)) + path[-1] + ": " + rendered)
    return "".join(line + newline for line in out)


def _flow(path: tuple[str, ...], rendered: str) -> str:
    entry = rendered
    for part in reversed(path[1:]):
        entry = "{" + part + ": " + entry + "}"
    return path[0] + ": " + entry
