"""The recipe class of a stage a plugin adds, made from its `StageSpec`.

A plugin publishes a `stage_specs.StageSpec` in the entry-point group ``recipeforge.stages``; its
recipe class is `Recipe` with the stage's name as `stage` and its own section (`section_model`),
made once per spec. The built-in stages' classes are written out in `schema.stage_recipes`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, create_model

from recipeforge.config.schema.recipe import Recipe

from recipeforge.config.schema.stage_recipes import STAGE_CLASSES, STAGE_ONLY_SECTIONS
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import StageSpec, stage_registry

__all__ = ["recipe_class"]

_PLUGIN_CLASSES: dict[StageSpec, type[Recipe]] = {}  # a plugin reinstalled in-process is a new spec


def recipe_class(stage: str) -> type[Recipe] | None:
    """The recipe class of `stage`: a built-in stage's, or the one made for a plugin's stage from its
    spec (loading the plugin); None for a name no stage has. A plugin that fails to load, or whose
    section cannot be a recipe key, raises `RecipeError` at `stage`."""
    builtin = STAGE_CLASSES.get(stage)
    if builtin is not None or not stage_registry.has(stage):
        return builtin
    spec = stage_registry.get(stage, key="stage")
    if spec not in _PLUGIN_CLASSES:
        _PLUGIN_CLASSES[spec] = _plugin_recipe(spec)
    return _PLUGIN_CLASSES[spec]


def _plugin_recipe(spec: StageSpec) -> type[Recipe]:
    """A plugin stage's recipe class: `Recipe` with its `stage` name and its section (`section_model`)."""
    name = str(spec.name)
    fields: dict[str, Any] = {"stage": (Literal[name], Field(description=f"Training stage: {name}."))}
    if spec.section is not None:
        taken = set(Recipe.model_fields) | set(STAGE_ONLY_SECTIONS)
        if spec.section in taken:
            raise RecipeError(f"the stage '{name}' names its section '{spec.section}', which is already a recipe "
                              "key", key="stage", hint=f"the plugin publishing '{name}' must use another key")
        if spec.rollout:
            from recipeforge.config.schema.stages import OnPolicyConfig

            if not issubclass(spec.section_model, OnPolicyConfig):
                raise RecipeError(f"the on-policy stage '{name}' has a section that is no OnPolicyConfig",
                                  key="stage", hint="its section_model must subclass "
                                                    "recipeforge.config.schema.stages.OnPolicyConfig")
        model = spec.section_model
        required = any(f.is_required() for f in model.model_fields.values())
        what = f"{name} settings."
        fields[spec.section] = (model, Field(description=what) if required
                                else Field(default_factory=model, description=what))
    title = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) + "Recipe"
    cls: type[Recipe] = create_model(title, __base__=Recipe, __doc__=spec.summary, **fields)
    return cls
