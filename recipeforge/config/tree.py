"""A plain config tree (dicts, lists, scalars) plus the provenance of every key in it.

Provenance maps a key path such as ``("adapter", "r")`` to the `Location` where that key was
written: a recipe file, a parent recipe, ``<env>`` or ``<cli>``. Every later step keeps it
up to date so that errors can point at the line the user has to change.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Iterator

from recipeforge.errors import Location
from recipeforge.json_value import JSONValue

KeyPath = tuple


@dataclass
class ConfigTree:
    """Config data and the location of each key path in it."""

    data: dict
    prov: dict[KeyPath, Location] = field(default_factory=dict)
    root: Location = field(default_factory=lambda: Location("<recipe>"))

    def locate(self, path: KeyPath) -> Location:
        """Location of `path`, or of its nearest written ancestor, or of the document."""
        path = tuple(path)
        while path:
            if path in self.prov:
                return self.prov[path]
            path = path[:-1]
        return self.root

    def get(self, path: KeyPath, default: JSONValue = None) -> Any:
        node: Any = self.data
        for part in path:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return default
        return node

    def set(self, path: KeyPath, value: JSONValue, location: Location) -> None:
        """Set `path` (creating mappings on the way) and record where the value came from."""
        node = self.data
        for i, part in enumerate(path[:-1]):
            nxt = node[part] if _has(node, part) else None
            if not isinstance(nxt, (dict, list)):
                nxt = {}
                node[part] = nxt
                self.prov.setdefault(tuple(path[: i + 1]), location)
            node = nxt
        last = path[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last > len(node):
                raise IndexError(last)
            if last == len(node):
                node.append(value)
            else:
                node[last] = value
        else:
            node[last] = value
        self.drop_prov_below(path)
        self.prov[tuple(path)] = location
        for sub, loc in _walk_paths(value, tuple(path)):
            self.prov[sub] = location

    def delete(self, path: KeyPath) -> bool:
        """Remove `path`; returns False when it was not there."""
        parent = self.get(path[:-1]) if len(path) > 1 else self.data
        last = path[-1]
        if not _has(parent, last):
            return False
        del parent[last]
        self.drop_prov_below(path)
        self.prov.pop(tuple(path), None)
        return True

    def drop_prov_below(self, path: KeyPath) -> None:
        n = len(path)
        for key in [k for k in self.prov if len(k) > n and k[:n] == tuple(path)]:
            del self.prov[key]

    def copy(self) -> "ConfigTree":
        return ConfigTree(copy.deepcopy(self.data), dict(self.prov), self.root)


def _has(node: JSONValue, part: str | int) -> bool:
    if isinstance(node, dict):
        return part in node
    if isinstance(node, list):
        return isinstance(part, int) and 0 <= part < len(node)
    return False


def leaves(node: JSONValue, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, JSONValue]]:
    """(key path, value) of every non-container value below `node`, depth first."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, prefix + (i,))
    else:
        yield prefix, node


def _walk_paths(value: JSONValue, prefix: KeyPath) -> Iterator[tuple[KeyPath, None]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield prefix + (k,), None
            yield from _walk_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield prefix + (i,), None
            yield from _walk_paths(v, prefix + (i,))


def merge_trees(base: ConfigTree, over: ConfigTree) -> ConfigTree:
    """Deep-merge `over` onto `base`: mappings merge key by key, anything else is replaced.

    Lists are replaced whole (a child recipe's ``datasets`` list is the list it means), the
    convention of Hydra and most recipe tools.
    """
    out = base.copy()
    out.root = over.root

    def merge(dst: dict, src: dict, prefix: KeyPath) -> None:
        for key, value in src.items():
            path = prefix + (key,)
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                out.prov[path] = over.prov.get(path, out.prov.get(path, over.root))
                merge(dst[key], value, path)
            else:
                dst[key] = copy.deepcopy(value)
                out.drop_prov_below(path)
                for p, loc in over.prov.items():
                    if p[: len(path)] == path:
                        out.prov[p] = loc

    merge(out.data, over.data, ())
    return out
