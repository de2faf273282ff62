"""The `Plan` of a chosen layout: its sizes, its reasons in print order, its extras and its backend's traits."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.plan.hardware import GIB
from recipeforge.plan.layout_reasons import activation_summary, layout_reasons, source_reasons
from recipeforge.plan.parallel_layouts import parallel_reasons
from recipeforge.plan.plan_extras import plan_extras
from recipeforge.plan.phases import check_host_phases, phase_peaks
from recipeforge.plan.step_reasons import memory_reasons, side_model_reasons, step_reasons
from recipeforge.plan.types import Choice, Plan

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.policy import Decision, Evaluation
    from recipeforge.plan.workload import Workload


def build_plan(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, decision: Decision,
                model_source: str) -> Plan:
    """The `Plan` of the chosen evaluation: its sizes, every reason in the order the plan prints them, its
    extras with the whole run's phase peaks (a phase that does not fit host RAM is a warning here when
    the RAM is assumed; `check_host_phases` raises when it is known), and the backend's traits."""
    peaks = phase_peaks(recipe, w, hw, ev)  # the whole run's: load, train, eval, save, merge
    short = check_host_phases(peaks, hw, recipe.distributed.memory_headroom)
    if short is not None:
        decision.warnings.append(short)
    layout = ev.layout
    device = hw.device
    limit_gb = ev.limit / GIB
    spec = layout.spec
    terms = activation_summary(w, ev, spec)
    # The insertion order of `reasons` is the order the text and JSON forms print them in.
    reasons: dict[str, Choice] = {}
    reasons.update(source_reasons(recipe, w, hw, model_source))
    reasons.update(layout_reasons(recipe, w, hw, ev, decision, spec, limit_gb))
    reasons.update(parallel_reasons(layout, recipe.distributed, w,
                                    ev.memory.components.get("activations", 0.0) / GIB, terms))
    reasons.update(step_reasons(recipe, ev))
    reasons.update(memory_reasons(recipe, w, hw, ev, limit_gb))
    reasons.update(side_model_reasons(recipe, w, hw, ev, limit_gb))
    extra = plan_extras(w, hw, ev, decision, spec, model_source, limit_gb, terms)
    plan = Plan(
        backend=layout.backend, preset=layout.preset, device=device,
        nodes=layout.nodes if device == "cuda" else 1,
        gpus_per_node=layout.gpus_per_node if device == "cuda" else 0,
        world_size=max(1, layout.world_size),
        data_parallel=layout.data_parallel, tensor_parallel=layout.tensor_parallel,
        pipeline_parallel=layout.pipeline_parallel, micro_batch_size=ev.micro_batch,
        gradient_accumulation=ev.accumulation,
        global_batch_size=ev.micro_batch * ev.accumulation * layout.data_parallel,
        gradient_checkpointing=ev.checkpointing, checkpoint_mode=w.checkpoint_mode, checkpoint_every=w.checkpoint_every,
        offload=layout.offload, backend_part=spec.plan_part(layout),
        memory_gb=ev.memory.gb(), reasons=reasons, extra=extra)
    plan = replace(plan, traits=spec.traits(plan))
    return replace(plan, extra=replace(plan.extra, phases=[p.as_dict() for p in peaks]))
