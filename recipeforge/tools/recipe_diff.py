"""`recipeforge diff A B`: the semantic difference of two recipes, run directories or lock files.

Both sides are loaded and resolved the way `train` would (extends, `${...}`, defaults), so a
difference of spelling (a default written out, a value set through a parent recipe) is no
difference. Recipe keys and `lock:` keys are compared leaf by leaf (`run_guard.leaf_changes`) and
listed apart: changed (old -> new), added (only in B), removed (only in A).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError, format_key
from recipeforge.outputs.run_guard import MISSING, leaf_changes, show_value

# What a run directory holds, in the order it is read: the lock `train` writes, then the resolved recipe.
RUN_DIR_FILES = ("recipe.lock.yaml", "resolved_recipe.yaml")


def side_path(arg: str) -> Path:
    """The recipe file `arg` names: itself, or the lock / resolved recipe inside a run directory."""
    path = Path(arg).expanduser()
    if path.is_dir():
        for name in RUN_DIR_FILES:
            if (path / name).is_file():
                return path / name
        raise RecipeError(f"{arg} is a directory without {' or '.join(RUN_DIR_FILES)}",
                          hint="give a recipe file, a lock file, or a run directory written by `recipeforge train`")
    if not path.is_file():
        raise RecipeError(f"{arg}: no such file or directory",
                          hint="give a recipe file, a lock file, or a run directory written by `recipeforge train`")
    return path


def resolved_side(arg: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The resolved recipe of `arg` (credentials redacted) and its `lock:` section apart (None: no lock)."""
    from recipeforge.config import load_recipe
    from recipeforge.config.dump import resolved_data

    data = resolved_data(load_recipe(side_path(arg)))
    return data, data.pop("lock", None)


def diff_sides(a: str, b: str) -> tuple[list[str], list[str]]:
    """Report lines for the recipe keys and for the lock keys that differ between `a` and `b`."""
    data_a, lock_a = resolved_side(a)
    data_b, lock_b = resolved_side(b)
    if (lock_a is None) != (lock_b is None):  # one side is locked: listing every locked value says nothing more
        return _grouped(leaf_changes(data_a, data_b)), [f"  only {a if lock_b is None else b} has a lock: section"]
    return _grouped(leaf_changes(data_a, data_b)), _grouped(leaf_changes(lock_a or {}, lock_b or {}))


def render_diff(a: str, b: str, recipe_lines: list[str], lock_lines: list[str]) -> str:
    """The report `recipeforge diff` prints."""
    if not recipe_lines and not lock_lines:
        return f"no differences: {a} and {b} resolve to the same recipe and lock\n"
    out = [f"--- {a}", f"+++ {b}"]
    out += ["recipe:", *recipe_lines] if recipe_lines else ["recipe: no differences"]
    out += ["lock:", *lock_lines] if lock_lines else ["lock: no differences"]
    return "\n".join(out) + "\n"


def _grouped(changes: list[tuple[tuple, Any, Any]]) -> list[str]:
    groups: dict[str, list[str]] = {"changed": [], "added": [], "removed": []}
    for key, old, new in changes:
        if key == ():  # the empty side of a section present on one side only; its leaves follow
            continue
        if old is MISSING:
            groups["added"].append(f"    {format_key(key)}: {show_value(new)}")
        elif new is MISSING:
            groups["removed"].append(f"    {format_key(key)}: {show_value(old)}")
        else:
            groups["changed"].append(f"    {format_key(key)}: {show_value(old)} -> {show_value(new)}")
    return [line for name, lines in groups.items() if lines for line in [f"  {name}:", *lines]]
