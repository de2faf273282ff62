"""`recipeforge eval RUN_DIR|RECIPE [...]`: which runs, which tasks, which settings; then evaluate each
run and refresh its model card."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from recipeforge.errors import RecipeError
from recipeforge.json_value import JSONValue
from recipeforge.stage_specs import known_stage_spec
from recipeforge.tools.evaluation.runner import EvalOptions


@dataclass(frozen=True)
class Target:
    """One run to evaluate, with the `eval:` section of its recipe (None: none readable) and the folder
    that section's local task paths are relative to."""

    run_dir: Path
    eval_section: dict[str, Any] | None
    base_dir: Path
    stage: str | None = None
    allow_code: bool = False  # the recipe's own opt-in, for the task files its eval.tasks name


def target(arg: str) -> Target:
    """A run directory, or a recipe file standing for the run directory it trains (its output.dir)."""
    path = Path(arg).expanduser()
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        from recipeforge.config import load_recipe
        from recipeforge.outputs.run_dir import default_run_dir

        recipe = load_recipe(path).recipe
        return Target(default_run_dir(recipe, path), recipe.eval.model_dump(), path.resolve().parent, recipe.stage,
                      recipe.allow_code)
    if not path.is_dir():
        raise RecipeError(f"{arg}: no such run directory or recipe file",
                          hint="recipeforge eval RUN_DIR|RECIPE [RUN_DIR ...] [--tasks ...]")
    from recipeforge.outputs.run_guard import read_resolved

    resolved = read_resolved(path / "resolved_recipe.yaml") or {}
    section = _eval_section(resolved.get("eval"))
    # resolved_recipe.yaml holds local task paths made absolute; relative ones are taken from here.
    return Target(path, section, Path.cwd(), resolved.get("stage"), resolved.get("allow_code") is True)


def _eval_section(raw: JSONValue) -> dict[str, Any] | None:
    """The `eval:` of a run's resolved_recipe.yaml, with what a hand-edited or damaged file may hold in
    its place dropped: tasks that are not strings, counts that are not positive integers."""
    if not isinstance(raw, dict):
        return None
    section = dict(raw)
    tasks = section.get("tasks")
    section["tasks"] = [t for t in tasks if isinstance(t, str) and t] if isinstance(tasks, list) else []
    for key in ("batch_size", "limit", "num_fewshot", "max_new_tokens"):
        value = section.get(key)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key == "num_fewshot" else 1)):
            section[key] = None
    return section


def options_for(section: dict[str, Any] | None, *, batch_size: int | None, limit: int | None,
                device: str | None) -> EvalOptions:
    """The recipe's `eval:` settings with the command's flags over them."""
    section = section or {}
    base = EvalOptions(batch_size=section.get("batch_size"), limit=section.get("limit"),
                       num_fewshot=section.get("num_fewshot"), max_new_tokens=section.get("max_new_tokens") or 32,
                       apply_chat_template=bool(section.get("apply_chat_template")), device=device)
    return replace(base, batch_size=batch_size or base.batch_size, limit=limit or base.limit)


def evaluate_targets(args: list[str], *, tasks: list[str] | None, batch_size: int | None, limit: int | None,
                     device: str | None, checkpoints: bool,
                     log: Callable[[str], None]) -> list[tuple[Path, dict[str, dict[str, dict]]]]:
    """Evaluate each run of `args` on `tasks` (default: the first run's eval.tasks), each run's model
    card refreshed; returns (run dir, records by task by subject: "final", "checkpoint-N") per run."""
    from recipeforge.tools.evaluation.runner import evaluate_run, require_final, require_lm_eval

    targets = [target(a) for a in args]
    require_lm_eval()
    for t in targets:  # every run checked before the first one spends minutes evaluating
        require_final(t.run_dir)
        spec = known_stage_spec(t.stage)
        if spec is not None and spec.scores:
            raise RecipeError(f"{t.run_dir} is a reward model: it scores texts and generates none, so "
                              "language-model tasks do not apply",
                              hint="evaluate the policy it helps train, or its pair accuracy in the run's "
                                   "metrics (eval_accuracy)")
    # Task files named on the command line run code only with --trust-code; those of the recipe's
    # eval.tasks also with the recipe's own allow_code.
    names, base_dir = (tasks, Path.cwd()) if tasks else ((targets[0].eval_section or {}).get("tasks") or [],
                                                          targets[0].base_dir)
    allow_code, key = (False, "--tasks") if tasks else (targets[0].allow_code, "eval.tasks")
    done = []
    for t in targets:
        options = options_for(t.eval_section, batch_size=batch_size, limit=limit, device=device)
        records = evaluate_run(t.run_dir, list(names), base_dir, options, log=log, checkpoints=checkpoints,
                               allow_code=allow_code, key=key)
        refresh_card(t.run_dir)
        done.append((t.run_dir, records))
    return done


def refresh_card(run_dir: Path) -> None:
    """Put the run's evaluation results into its model card (README.md), when it has one."""
    from recipeforge.tools.model_card import update_eval_section

    readme = Path(run_dir) / "README.md"
    if readme.is_file():
        update_eval_section(readme, run_dir)
