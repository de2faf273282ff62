"""Looking up a component a recipe names, and checking its options, as located rule problems."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.config.schema.problems import RuleProblem, model_problems
from recipeforge.errors import RecipeError, did_you_mean

if TYPE_CHECKING:
    from recipeforge.registry import Registry


def lookup(registry: "Registry", name: str, path: tuple) -> tuple[Any, RuleProblem | None]:
    """The component `name` (importing its plugin if needed), or the problem at `path` saying why not."""
    try:
        return registry.get(name), None
    except RecipeError as exc:
        p = exc.problems[0]
        return None, RuleProblem(path, p.message, p.hint)


def options_problems(model: object, data: object, path: tuple) -> list[RuleProblem]:
    """`data` checked against a component's options model (no model: anything goes)."""
    if model is None:
        return []
    from pydantic import BaseModel

    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return [RuleProblem(path, f"the plugin declares an options schema that is not a pydantic model "
                                  f"({type(model).__name__})", "report it to the plugin's authors")]

    return model_problems(model, data, path)


def unknown_name(path: tuple, what: str, name: str, known: list[str]) -> RuleProblem:
    """The problem of a name no table knows: the closest known name and the available ones."""
    close = did_you_mean(name, known)
    return RuleProblem(path, f"unknown {what} '{name}'", f"{close + ' ' if close else ''}available: {', '.join(known)}")
