"""Limits on ``${...}`` interpolation, checked before OmegaConf resolves anything.

OmegaConf resolves references recursively and builds strings by concatenation, so a recipe could make
it recurse past Python's limit (a chain of a thousand keys, each naming the next) or build gigabytes
(``b: ${a}${a}...``, ``c: ${b}${b}...``). Here every interpolated value's reference chain is followed
on the plain tree: chains longer than `MAX_CHAIN`, cycles, and values that would expand past
`MAX_STRING` characters are reported at their own key. Only the ``env`` resolver is allowed: the
others OmegaConf ships (``oc.env`` among them) would read the environment without the secret
tracking that ``${env:...}`` has.
"""

from __future__ import annotations

import re
from typing import Any

from recipeforge.config.load import MAX_STRING
from recipeforge.config.tree import ConfigTree, leaves as tree_leaves
from recipeforge.errors import Problem, format_key
from recipeforge.json_value import JSONValue

MAX_CHAIN = 16
ALLOWED_RESOLVERS = ("env",)
_RESOLVER = re.compile(r"(?<!\\)\$\{\s*([A-Za-z_][\w.\-]*)\s*:")
_REFERENCE = re.compile(r"(?<!\\)\$\{\s*([^${}:\s]*)\s*\}")  # ${a.b}, ${.sibling}; not ${env:...}


class _Cycle(Exception):
    def __init__(self, chain: list[tuple]):
        self.chain = chain


class _TooDeep(Exception):
    pass


def check_interpolations(tree: ConfigTree, leaves: list[tuple[tuple, str]], defaults: dict) -> list[Problem]:
    """Problems (one per key) for unknown resolvers, self-references, over-long chains and oversized
    expansions among the interpolated `leaves` (path, raw text) of `tree`."""
    raw_by_path = dict(leaves)
    sizes: dict[tuple, int] = {}
    problems: list[Problem] = []

    def size(path: tuple, stack: list[tuple]) -> int:
        if path in sizes:
            return sizes[path]
        if path in stack:
            raise _Cycle(stack[stack.index(path):] + [path])
        if len(stack) >= MAX_CHAIN:
            raise _TooDeep()
        raw = raw_by_path[path]
        total = len(raw)
        for ref in _REFERENCE.findall(raw):
            target = _target(path, ref)
            if target is None:
                continue
            total += _value_size(target, lambda p: size(p, stack + [path]))
            if total > MAX_STRING:
                break
        sizes[path] = total
        return total

    def _value_size(target: tuple, leaf_size) -> int:
        # The referenced value: an interpolated leaf, a plain value, or a section (sum of its leaves).
        if target in raw_by_path:
            return leaf_size(target)
        value = _lookup(tree.data, target, _lookup(defaults, target, None))
        if isinstance(value, (dict, list)):
            total = 0
            for sub, leaf in tree_leaves(value, target):
                total += leaf_size(sub) if sub in raw_by_path else len(str(leaf))
            return total
        return len(str(value))

    for path, raw in leaves:
        where = (tree.locate(path), format_key(path))
        bad = [name for name in _RESOLVER.findall(raw) if name not in ALLOWED_RESOLVERS]
        if bad:
            problems.append(Problem(f"unknown resolver '{bad[0]}' in ${{...}}", *where,
                                    hint="only ${env:VAR} and ${env:VAR,default} read values from outside the "
                                         "recipe; other keys are referenced as ${section.key}"))
            continue
        try:
            if size(path, []) > MAX_STRING:
                problems.append(Problem(f"interpolation expands to more than {MAX_STRING} characters", *where,
                                        hint="reference long values once instead of repeating them"))
        except _Cycle as cycle:
            chain = " -> ".join(format_key(p) for p in cycle.chain)
            problems.append(Problem(f"interpolation refers to itself: {chain}", *where,
                                    hint="one of the keys in the loop must hold a value, not a ${...} reference"))
        except _TooDeep:
            problems.append(Problem(f"interpolation chain longer than {MAX_CHAIN} references", *where,
                                    hint="refer to the key that holds the value directly"))
    return problems


def _target(path: tuple, ref: str) -> tuple | None:
    """The key path a ``${ref}`` written at `path` names (relative refs start with dots)."""
    if not ref:
        return None
    if ref.startswith("."):
        dots = len(ref) - len(ref.lstrip("."))
        base = path[:-1]
        if dots - 1 > len(base):
            return None
        base = base[: len(base) - (dots - 1)]
        ref = ref[dots:]
    else:
        base = ()
    parts: list[Any] = []
    for part in ref.replace("[", ".").replace("]", "").split("."):
        if part == "":
            return None
        parts.append(int(part) if part.isdecimal() else part)
    return base + tuple(parts)


def _lookup(data: JSONValue, path: tuple, default: JSONValue) -> Any:
    node = data
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            return default
    return node
