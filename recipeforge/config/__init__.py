"""The recipe language: load -> compose -> overrides -> resolve -> validate.

`load_recipe` runs the whole pipeline and returns a typed, immutable `Recipe`. Nothing in this
package imports torch, transformers or any training backend.
"""

from recipeforge.config.pipeline import LoadedRecipe, load_recipe, resolve_tree

__all__ = ["LoadedRecipe", "load_recipe", "resolve_tree"]
