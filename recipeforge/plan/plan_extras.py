"""The plan's extras: the hardware and model summaries, precision, warnings and the runners-up with why
each was not chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.plan import policy
from recipeforge.plan.accuracy import band_class
from recipeforge.plan.hardware import GIB
from recipeforge.plan.layout_reasons import position
from recipeforge.plan.policy import install_hint
from recipeforge.plan.teacher_memory import teacher_summary
from recipeforge.plan.types import PlanExtras
from recipeforge.plan.vision_report import vision_summary

if TYPE_CHECKING:
    from recipeforge.plan.backend_spec import PlannerSpec
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.policy import Decision, Evaluation
    from recipeforge.plan.workload import Workload


def plan_extras(w: Workload, hw: Hardware, ev: Evaluation, decision: Decision, spec: PlannerSpec, model_source: str,
                 limit_gb: float, terms: str) -> PlanExtras:
    """Everything of the plan beside its choices and reasons."""
    return PlanExtras(
        hardware=hw.to_dict(),
        model={**w.model.summary(), "source": model_source, "trainable_params": w.trainable_params(),
               "decoder_layer_class": w.model.decoder_layer_class,
               "vision_block_class": w.model.vision.block_class if w.model.vision is not None else None},
        dtype=w.dtype,
        precision=_precision(spec, w),
        attention=w.attention,
        sequence_len=w.seq_len,
        memory_limit_gb=round(limit_gb, 2),
        cpu_memory_gb=round(ev.memory.cpu_per_node / GIB, 1),
        runners_up=_runners_up(ev, decision),
        warnings=_plan_warnings(w, hw, ev, decision),
        context_parallel=ev.layout.context_parallel,
        activations=terms,
        accuracy_class=band_class(w, ev.layout),
        vision=vision_summary(w, ev.micro_batch, ev.checkpointing),
        teacher=teacher_summary(w, ev.memory.gb()),
    )


def _plan_warnings(w: Workload, hw: Hardware, ev: Evaluation, decision: Decision) -> list[str]:
    warnings = list(decision.warnings)
    if ev.layout.offload != "none":
        ram, known = hw.host_ram_gb()
        if not known:
            warnings.append(f"host RAM of the target is unknown; offload assumes {ram:.0f} GB per node and needs "
                            f"{ev.memory.cpu_per_node / GIB:.0f} GB")
    warnings.extend(w.notes)
    warnings.extend(ev.memory.notes)
    return warnings


def _precision(spec: PlannerSpec, w: Workload) -> str:
    if w.dtype == "fp32":
        return "fp32 weights, gradients and optimizer states"
    if w.adapter != "none":
        base = w.dtype if w.adapter != "qlora" else ("4-bit NF4" if w.quant_bits == 4 else "8-bit")
        return f"frozen {base} base weights; fp32 adapter weights, gradients and optimizer states; {w.dtype} compute"
    return spec.precision(w)


def _runners_up(ev: Evaluation, decision: Decision) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    chosen_index = position(decision, ev)
    for i, e in enumerate(decision.evaluations):
        if e is ev:
            continue
        if not e.fits:
            why = e.problem
        elif i < chosen_index:
            why = f"fits, but {e.layout.backend} is not installed ({install_hint(e.layout.capabilities)})" \
                if not policy.backend_installed(e.layout.capabilities) else "fits"
        else:
            why = f"fits, but comes later in preference order than {ev.layout.label}"
        out.append({"backend": e.layout.backend, "preset": e.layout.preset, "fits": e.fits,
                    "memory_gb": round(e.memory.total / GIB, 2), "why": why, "label": e.layout.label})
    return out
