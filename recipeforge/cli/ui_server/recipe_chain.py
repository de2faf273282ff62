"""The recipe files an edit may name: a recipe and the parents its `extends:` chain names on disk."""

from __future__ import annotations

from pathlib import Path

from recipeforge.errors import RecipeError


def disk_chain(path: Path) -> list[Path]:
    """`path` and every recipe file its `extends:` chain names on disk (real paths). A parent that cannot
    be read or is not a recipe (another tool's config, a system file) is left out, so the page never shows
    it; validation reports it at its `extends` entry without quoting it."""
    from recipeforge.config.compose import MAX_DEPTH as CHAIN_DEPTH, locate_parent, recipe_top_level_keys
    from recipeforge.config.load import load_yaml_file
    from recipeforge.errors import Location

    seen: list[Path] = []
    todo = [path.resolve()]
    keys = recipe_top_level_keys()
    while todo and len(seen) < CHAIN_DEPTH:
        current = todo.pop(0)
        if current in seen:
            continue
        try:
            parents = load_yaml_file(current, recipe_keys=keys if seen else None).data.get("extends")
        except (RecipeError, OSError):
            continue
        seen.append(current)
        refs = [parents] if isinstance(parents, str) else parents if isinstance(parents, list) else []
        for ref in refs:
            if isinstance(ref, str):
                try:
                    todo.append(locate_parent(ref, current.parent, Location(str(current))).resolve())
                except (RecipeError, OSError):
                    continue
    return seen
