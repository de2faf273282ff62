"""JSON Schema of the recipe, for editors (yaml-language-server) and other tools."""

from __future__ import annotations

from recipeforge import __version__
from recipeforge.config.schema.stage_recipes import recipe_adapter

_EXTENDS = {
    "description": "Parent recipe(s), relative to this file or pkg://<plugin>/<file>.yaml; merged parent first, "
                   "this file last.",
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
}


def recipe_json_schema() -> dict:
    """The recipe's JSON Schema (draft 2020-12), with `extends` allowed in every stage."""
    schema = recipe_adapter().json_schema(mode="validation")
    for definition in schema.get("$defs", {}).values():
        if definition.get("title", "").endswith("Recipe") and "stage" in definition.get("properties", {}):
            definition["properties"] = {"extends": _EXTENDS, **definition["properties"]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"recipeforge recipe ({__version__})",
        **schema,
    }
