"""Plugin base recipes: ``extends: pkg://<name>/<file>.yaml`` names a YAML file that a plugin ships.

A ``recipeforge.recipes`` entry point names a package; the registry finds it (reporting two plugins
that claim one name) and `config.compose` reads its YAML files as data, never importing code from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from recipeforge.registry import Registry


@dataclass(frozen=True)
class RecipePackage:
    """A plugin's base recipes: ``extends: pkg://<name>/<file>.yaml`` names a file in `directory`."""

    name: str
    directory: Path
    files: tuple[str, ...]


def _as_recipes(name: str, module: ModuleType) -> RecipePackage:
    """A ``recipeforge.recipes`` entry point names a package; its directory holds the YAML files."""
    paths = list(getattr(module, "__path__", None) or [])  # packages (namespace ones too) have a __path__
    if not paths:
        raise TypeError(f"'{getattr(module, '__name__', module)}' is not a package (a directory of YAML files)")
    directory = Path(paths[0])
    files = tuple(sorted(p.name for p in directory.iterdir() if p.suffix in (".yaml", ".yml")))
    if not files:
        raise TypeError(f"package {module.__name__} holds no .yaml recipes")
    return RecipePackage(name, directory, files)


recipes: Registry[RecipePackage] = Registry("recipes", coerce=_as_recipes)
