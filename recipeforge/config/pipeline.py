"""The recipe pipeline in one call: load -> compose -> overrides -> resolve -> validate."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from recipeforge.config.compose import compose_file
from recipeforge.config.overrides import FlagValue, apply_cli, apply_env, apply_flags
from recipeforge.config.resolve import UnresolvedValues, resolve_interpolations
from recipeforge.config.schema.defaults import schema_defaults
from recipeforge.config.schema.recipe import Recipe
from recipeforge.config.tree import ConfigTree
from recipeforge.config.validate import validate_tree
from recipeforge.errors import RecipeError, format_key, sort_problems


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe plus where it came from."""

    recipe: Recipe
    path: Path
    tree: ConfigTree
    env_refs: dict = field(default_factory=dict)  # key path -> env variables its value was read from


def resolve_tree(path: str | Path, overrides: Sequence[str] = (),
                 environ: Mapping[str, str] | None = None,
                 flags: Sequence[FlagValue] = (), text: str | None = None) -> tuple[ConfigTree, dict]:
    """Compose, override and interpolate a recipe file, without validating it: environment overrides,
    then `key=value` arguments, then values of command-line flags (`--hardware`). `text`: the recipe's
    own text in place of the file's (`compose_file`)."""
    tree = compose_file(path, text)
    apply_env(tree, os.environ if environ is None else environ, sections=Recipe.model_fields)
    apply_cli(tree, overrides)
    apply_flags(tree, flags)
    return resolve_interpolations(tree, schema_defaults(tree.data.get("stage")))


def load_recipe(path: str | Path, overrides: Sequence[str] = (),
                environ: Mapping[str, str] | None = None, flags: Sequence[FlagValue] = (),
                text: str | None = None) -> LoadedRecipe:
    """Load, compose, override, resolve and validate the recipe at `path` (or `text`, the recipe's own
    text not saved yet, read as if it were the file at `path`)."""
    try:
        tree, env_refs = resolve_tree(path, overrides, environ, flags, text)
    except UnresolvedValues as unresolved:
        # Report the recipe's other problems too, except those caused by the unresolved keys.
        problems = list(unresolved.problems)
        try:
            validate_tree(unresolved.partial)
        except RecipeError as exc:
            bad = {format_key(p) for p in unresolved.paths}
            problems.extend(p for p in exc.problems if p.key not in bad)
        raise RecipeError(sort_problems(problems)) from None
    return LoadedRecipe(validate_tree(tree), Path(path), tree, env_refs)
