"""The resolved recipe as YAML: every default filled in, and loadable again to the same Recipe."""

from __future__ import annotations

import yaml

from recipeforge import __version__


def recipe_to_data(recipe) -> dict:
    """Plain JSON-compatible data of a validated recipe (all defaults present; no `lock:` unless it has one)."""
    data = recipe.model_dump(mode="json")
    if data.get("lock", True) is None:  # an unlocked recipe reads as it did before `lock:` existed
        del data["lock"]
    return data


def resolved_data(loaded) -> dict:
    """The resolved recipe as data, with values read from secret environment variables and credentials
    written into the recipe (URL passwords, keys named like tokens or passwords) redacted."""
    from recipeforge.config.secrets import redact, redact_literals

    return redact_literals(redact(recipe_to_data(loaded.recipe), loaded.env_refs))


def dump_recipe(loaded, header: bool = True) -> str:
    """YAML text of a loaded recipe (secrets redacted), with a comment naming its source."""
    text = yaml.safe_dump(resolved_data(loaded), sort_keys=False, allow_unicode=True, width=100)
    if not header:
        return text
    return (f"# Resolved by recipeforge {__version__} from {loaded.path} (extends, overrides, ${{...}} and "
            f"defaults applied).\n"
            + text)
