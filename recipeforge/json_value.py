"""The type of a parsed YAML or JSON value: what a recipe file, a config.json or a request body holds.

A type only (nothing runs here): functions that walk or pass on parsed data say so with `JSONValue`
rather than `Any`, and narrow it with ``isinstance`` where they read it.
"""

from __future__ import annotations

from typing import Dict, List, TypeAlias, Union

JSONScalar: TypeAlias = Union[str, int, float, bool, None]
JSONValue: TypeAlias = Union[JSONScalar, List["JSONValue"], Dict[str, "JSONValue"]]
JSONObject: TypeAlias = Dict[str, JSONValue]
