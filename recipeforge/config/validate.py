"""Validation of a resolved tree into a typed `Recipe`, with every problem located and hinted.

Two passes, reported together: pydantic builds the `Recipe` from the tree (each section on its
own), then the cross-field rules (`schema.rules.check_rules`) run on the built recipe. Each problem
becomes a `Problem` at the file, line and key the user has to change. `model_problems` gives plugin
schemas (kernel options, reward args, rollout options) the same messages as the core schema;
`check_components` checks the reward names of a recipe against this environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from recipeforge.config.schema.problems import RuleProblem, described, model_problems
from recipeforge.config.schema.plugin_stages import recipe_class
from recipeforge.config.schema.recipe import Recipe
from recipeforge.config.schema.stage_recipes import STAGE_CLASSES, recipe_adapter
from recipeforge.config.schema.rules import check_rules
from recipeforge.config.tree import ConfigTree
from recipeforge.errors import Problem, RecipeError, did_you_mean, format_key, sort_problems
from recipeforge.json_value import JSONValue
from recipeforge.stage_specs import rl_section, stage_names

__all__ = ["check_components", "model_problems", "validate_tree"]


def validate_tree(tree: ConfigTree) -> Recipe:
    """Validate `tree` against the recipe schema and its cross-field rules; raise `RecipeError` listing
    all problems."""
    stage = tree.data.get("stage") if isinstance(tree.data, dict) else None
    # A plugin's stage is validated against its own class; the union holds the built-in stages.
    plugin = _plugin_class(tree, stage)
    try:
        recipe = (plugin.model_validate(tree.data) if plugin is not None
                  else recipe_adapter().validate_python(tree.data))
    except ValidationError as exc:
        errors = exc.errors()
    else:
        # The rules need every section valid, so they run only on a built recipe; all their
        # violations come together, each at its own key.
        violations = check_rules(recipe)
        if violations:
            raise RecipeError(sort_problems([_located(tree, p) for p in violations])) from None
        return recipe
    problems: list[Problem] = []
    if plugin is not None:
        problems.extend(_problems(errors, tree, plugin, strip_tag=False))
    elif errors and errors[0]["type"] in ("union_tag_invalid", "union_tag_not_found", "model_attributes_type"):
        problems.append(_stage_problem(tree, stage))
        # Still check the rest against the closest stage, so the user sees every problem at once.
        guess = (did_you_mean(str(stage), stage_names()) or "'sft'").split("'")[1] if stage is not None else "sft"
        if isinstance(tree.data, dict):
            try:
                closest = _plugin_class(tree, guess) or STAGE_CLASSES[guess]
            except RecipeError:  # the closest name is a plugin that fails to load: the common keys only
                closest = Recipe
            try:
                closest.model_validate({**tree.data, "stage": guess})
            except ValidationError as inner:
                problems.extend(_problems(inner.errors(), tree, closest, strip_tag=False))
    else:
        cls = STAGE_CLASSES.get(stage, Recipe)
        problems.extend(_problems(errors, tree, cls, strip_tag=True))
    raise RecipeError(sort_problems(problems)) from None


def _located(tree: ConfigTree, problem: RuleProblem) -> Problem:
    return Problem(problem.message, tree.locate(problem.path), format_key(problem.path), problem.hint)


def _plugin_class(tree: ConfigTree, stage: JSONValue) -> type[Recipe] | None:
    """The recipe class of a stage a plugin adds (None for a built-in stage or an unknown name); a
    plugin that fails to load is reported at the recipe's `stage:`."""
    if not isinstance(stage, str) or stage in STAGE_CLASSES:
        return None
    try:
        return recipe_class(stage)
    except RecipeError as exc:
        where = tree.locate(("stage",))
        raise RecipeError([Problem(p.message, where, "stage", p.hint) for p in exc.problems]) from None


def _stage_problem(tree: ConfigTree, stage: JSONValue) -> Problem:
    names = stage_names()  # the built-in stages, then the plugins'
    if stage is None:
        return Problem("required key 'stage' is missing", tree.root, "stage",
                       hint=f"add `stage: <one of {', '.join(names)}>`")
    return Problem(f"must be one of {', '.join(names)} (got {stage!r})", tree.locate(("stage",)), "stage",
                   hint=did_you_mean(str(stage), names))


def _problems(errors: list[dict], tree: ConfigTree, cls: type[BaseModel], strip_tag: bool) -> list[Problem]:
    return [Problem(message, tree.locate(path), format_key(path), hint)
            for path, message, hint in described(errors, cls, strip_tag)]


def check_components(loaded: Any) -> None:
    """Check that every reward a recipe names exists here (built in, or from an installed plugin).

    Loading a recipe checks formats, kernels, rollout engines, the code opt-in and every plugin's
    options; reward names are checked here instead, so that a recipe loads (resolve, inspect) where its
    reward plugin is not installed. The CLI's `validate`, `plan` and `train` call this; training checks
    the rewards again when it builds them. `loaded` is a `LoadedRecipe` (or a bare `Recipe`).
    """
    from recipeforge.components.rewards import rewards
    from recipeforge.registry import is_code_reference

    recipe = getattr(loaded, "recipe", loaded)
    tree = getattr(loaded, "tree", None)
    problems: list[Problem] = []
    rl = rl_section(recipe)
    for i, spec in enumerate(rl[1].rewards if rl is not None else ()):
        if is_code_reference(spec.name) or rewards.has(spec.name):
            continue
        path = (rl[0], "rewards", i, "name")
        err = rewards.unknown(spec.name, key=format_key(path), location=tree.locate(path) if tree else None)
        problems.extend(err.problems)
    if problems:
        raise RecipeError(sort_problems(problems))
