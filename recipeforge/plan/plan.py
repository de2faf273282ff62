"""`make_plan`: recipe + hardware -> `Plan`, every choice with its reason.

The steps, each in a module of its own: the workload (`workload`), the pins checked (`pins`), the precision
and the layout decided (`precision`, `policy`), the refusal when nothing fits (`no_fit`), and the plan
assembled with its reasons and the whole run's phase peaks (`assemble`, `worker_settings`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.plan.assemble import build_plan
from recipeforge.plan.catalog import resolve_model
from recipeforge.plan.hardware import Hardware, hardware_for
from recipeforge.plan.no_fit import raise_no_fit
from recipeforge.plan.pins import check_recipe_pins
from recipeforge.plan.planners import Planners
from recipeforge.plan.policy import decide
from recipeforge.plan.precision import choose_precision
from recipeforge.plan.workload import build_workload
from recipeforge.plan.worker_settings import worker_settings

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.types import Plan


def make_plan(recipe: Recipe, hardware: Hardware | None = None, planners: Planners | None = None) -> Plan:
    """Plan `recipe` on `hardware` (default: `hardware_for(recipe, None)`) with the backends of
    `planners` (default: every installed one, `Planners.installed()`).

    Raises `RecipeError` when nothing fits (saying by how much and what would), when a pinned
    layout does not fit, or when the batch sizes cannot be split over the data-parallel ranks.
    """
    hw = hardware if hardware is not None else hardware_for(recipe, None)
    planners = planners if planners is not None else Planners.installed()
    spec, model_source = resolve_model(recipe.model.name_or_path, recipe.model.revision)
    w = build_workload(recipe, spec, hw, planners)
    dist = recipe.distributed
    check_recipe_pins(recipe, w, hw, planners)
    # train.precision: fp32 master weights or pure bf16 (auto: by what fits), then the layout for it
    w, decision, precision = choose_precision(recipe, w, hw.device, lambda wl: decide(wl, hw, dist, recipe.train, planners),
                                                 planners)
    if decision.chosen is None:
        raise_no_fit(recipe, w, hw, decision, planners)
    ev = decision.chosen
    plan = build_plan(recipe, w, hw, ev, decision, model_source)
    added, over = worker_settings(recipe, w, hw, ev, precision)
    plan = replace(plan, reasons={**plan.reasons, **added})
    return replace(plan, extra=replace(plan.extra, warnings=[*plan.extra.warnings, *over])) if over else plan
