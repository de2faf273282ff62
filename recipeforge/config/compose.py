"""`extends:` composition: parents first (in list order), the recipe itself last.

A parent is a path relative to the recipe that names it, or ``pkg://<plugin>/<file>.yaml`` for a
base recipe shipped by an installed plugin (entry-point group ``recipeforge.recipes``).
"""

from __future__ import annotations

from pathlib import Path

from recipeforge.config.load import NotARecipe, load_yaml_file, load_yaml_text
from recipeforge.config.tree import ConfigTree, merge_trees
from recipeforge.errors import Location, Problem, RecipeError

PKG_SCHEME = "pkg://"
MAX_DEPTH = 32


def compose_file(path: str | Path, text: str | None = None) -> ConfigTree:
    """Load `path` and everything it extends into one merged tree (without the `extends` key). `text`:
    the recipe's own text in place of the file's (an edit not saved yet); its errors still name `path`,
    and its `extends` entries are relative to the folder of `path`."""
    return _compose(Path(path), stack=(), via=None, text=text)


def _compose(path: Path, stack: tuple[Path, ...], via: Location | None, text: str | None = None) -> ConfigTree:
    resolved = path.resolve()
    if resolved in stack:
        chain = " -> ".join(p.name for p in (*stack, resolved))
        raise RecipeError(f"extends cycle: {chain}", location=via, key="extends",
                          hint="remove one of the extends entries that close the loop")
    if len(stack) >= MAX_DEPTH:
        raise RecipeError(f"extends chain deeper than {MAX_DEPTH} files", location=via, key="extends")
    if text is not None:
        tree = load_yaml_text(text, str(path))
    else:
        tree = load_yaml_file(path) if via is None else _load_parent(path, via)
    parents = tree.data.get("extends")
    extends_loc = tree.prov.get(("extends",), tree.root)
    if isinstance(parents, str):
        entries = [(parents, extends_loc)]
    elif isinstance(parents, list) and all(isinstance(p, str) for p in parents):
        entries = [(p, tree.prov.get(("extends", i), extends_loc)) for i, p in enumerate(parents)]
    elif parents is None:
        entries = []
    else:
        raise RecipeError("extends must be a path or a list of paths", location=extends_loc, key="extends",
                          hint="e.g. extends: [../base/sft.yaml]")
    tree.delete(("extends",))
    if not entries:
        return tree
    merged: ConfigTree | None = None
    for ref, loc in entries:
        parent_path = locate_parent(ref, path.parent, loc)
        parent = _compose(parent_path, stack + (resolved,), loc)
        merged = parent if merged is None else merge_trees(merged, parent)
    assert merged is not None
    return merge_trees(merged, tree)


def _load_parent(path: Path, via: Location) -> ConfigTree:
    try:
        is_file, exists = path.is_file(), path.exists()
    except OSError as exc:  # a name too long, a loop of links
        raise RecipeError(f"cannot open the extended recipe: {exc.strerror}", location=via, key="extends") from None
    if not is_file:
        what = "is not a file" if exists else "not found"
        raise RecipeError(f"extended recipe {what}: {path}", location=via, key="extends",
                          hint="paths in extends are relative to the recipe that names them")
    try:
        return load_yaml_file(path, recipe_keys=recipe_top_level_keys())
    except NotARecipe as exc:
        # One error at the `extends` entry; nothing of the file (a system file, another tool's
        # config) is quoted.
        raise RecipeError(exc.problems[0].message, location=via, key="extends",
                          hint="extends names recipe files: mappings of stage:, model:, data:, train:, ...") from None
    except RecipeError as exc:
        # A parent that cannot be read or parsed is reported where it is named, with its own line
        # in the message (unreadable, not UTF-8, a syntax error, a tag or nesting it may not hold).
        raise RecipeError([Problem(f"{p.location.render()}: {p.message}" if p.location else p.message, via,
                                   "extends", p.hint) for p in exc.problems]) from None


def recipe_top_level_keys() -> set[str]:
    """Every key a recipe may hold at its top level (all stages), plus `extends`."""
    from recipeforge.config.schema.stage_recipes import STAGE_CLASSES

    return {"extends"}.union(*(cls.model_fields for cls in STAGE_CLASSES.values()))


def locate_parent(ref: str, base_dir: Path, loc: Location) -> Path:
    """The file an `extends` entry names."""
    if ref.startswith(PKG_SCHEME):
        return _plugin_recipe(ref, loc)
    return base_dir / ref


def _plugin_recipe(ref: str, loc: Location) -> Path:
    from recipeforge.config.plugin_recipes import recipes

    plugin, _, rel = ref[len(PKG_SCHEME):].partition("/")
    if not plugin or not rel:
        raise RecipeError(f"bad plugin recipe reference {ref!r}", location=loc, key="extends",
                          hint="write pkg://<plugin>/<file>.yaml")
    try:
        # The registry finds the plugin's package (reporting two plugins that claim one name); the
        # package is only located, its YAML files are read as data.
        package = recipes.get(plugin)
    except RecipeError as exc:
        raise RecipeError(f"no installed plugin ships recipes under '{plugin}'", location=loc, key="extends",
                          hint=exc.problems[0].hint) from None
    if rel not in package.files:
        raise RecipeError(f"plugin '{plugin}' has no recipe {rel!r}", location=loc, key="extends",
                          hint=f"it ships: {', '.join(package.files)}")
    return package.directory / rel
