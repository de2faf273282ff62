"""Numbers from an Axolotl config, with an error naming the key when a value is not one."""

from __future__ import annotations

from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.json_value import JSONValue


def num(value: JSONValue, cast: type, key: str) -> Any:
    """`value` as a number of type `cast`; anything else is a `RecipeError` naming the Axolotl key."""
    if isinstance(value, bool) or value is None:
        raise RecipeError(f"{key}: expected a number, got {value!r}", key=key)
    try:
        out = cast(float(value)) if cast is int and isinstance(value, str) else cast(value)
    except (TypeError, ValueError):
        raise RecipeError(f"{key}: expected a number, got {value!r}", key=key) from None
    if cast is int and isinstance(value, float) and value != out:
        raise RecipeError(f"{key}: expected a whole number, got {value!r}", key=key)
    return out
