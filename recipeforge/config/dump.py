"""The resolved recipe as YAML: every default filled in, and loadable again to the same Recipe."""

from __future__ import annotations

import yaml

from recipeforge import __version__


def recipe_to_data(recipe) -> dict:
    """Plain JSON-compatible data of a validated recipe (all defaults present)."""
    return recipe.model_dump(mode="json")


def dump_recipe(loaded, header: bool = True) -> str:
    """YAML text of a loaded recipe, with a comment naming its source."""
    text = yaml.safe_dump(recipe_to_data(loaded.recipe), sort_keys=False, allow_unicode=True, width=100)
    if not header:
        return text
    return (f"# Resolved by recipeforge {__version__} from {loaded.path} (extends, overrides, ${{...}} and "
            f"defaults applied).\n"
            + text)
