"""Default values of the schema as plain data, so that ``${train.global_batch_size}`` can refer to a
value the recipe leaves at its default."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from recipeforge.config.schema.plugin_stages import recipe_class
from recipeforge.config.schema.recipe import Recipe
from recipeforge.errors import RecipeError


def _defaults(model: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            value = field.default_factory()
            out[name] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        elif field.default is not PydanticUndefined:
            out[name] = field.default
        else:
            nested = _nested_model(field.annotation)
            if nested is not None:
                out[name] = _defaults(nested)
    return out


def _nested_model(tp: object) -> type[BaseModel] | None:
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def schema_defaults(stage: object) -> dict[str, Any]:
    """Defaults of the recipe class for `stage` (the common ones when the stage is unknown)."""
    try:
        cls = recipe_class(stage) if isinstance(stage, str) else None  # a plugin's stage: its made class
    except RecipeError:  # a plugin stage that fails to load: validation reports it at `stage:`
        cls = None
    return _defaults(cls or Recipe)
