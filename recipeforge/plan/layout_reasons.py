"""The plan's reasons for where its figures come from and the layout it chose: the hardware, the model and
its dtype, the backend against the layouts before it, the backend's own reasons, and the activation terms."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.plan.activations import activation_terms
from recipeforge.plan.hardware import GIB
from recipeforge.plan.memory import autocast_fp32_weights
from recipeforge.plan.models import human_count
from recipeforge.plan.pins import pinned
from recipeforge.plan.types import Choice

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.backend_spec import PlannerSpec
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.policy import Decision, Evaluation
    from recipeforge.plan.workload import Workload


def source_reasons(recipe: Recipe, w: Workload, hw: Hardware, model_source: str) -> dict[str, Choice]:
    """Where the hardware, the model's size and the dtype came from."""
    reasons: dict[str, Choice] = {}
    where = {"--hardware": "from --hardware", "recipe": "from the recipe's hardware: section",
             "probe": "probed on this machine"}
    reasons["hardware"] = Choice(hw.describe(), where[hw.source])
    active = f"; {human_count(w.model.active_params())} active per token" if w.model.is_moe else ""
    head = (f"; a {w.model.num_labels}-output sequence-classification head in place of the LM head"
            if w.model.num_labels else "")
    reasons["model"] = Choice(f"{human_count(w.model.total_params())} params",
                              f"counted from {model_source}{active}{head}")
    if recipe.model.dtype != "auto":
        dtype_why = "recipe sets it"
    elif hw.device == "cpu":
        dtype_why = "auto: fp32 on the CPU"
    else:
        assert hw.accelerator is not None  # a GPU target has one (`Hardware.device`)
        dtype_why = f"auto: {hw.accelerator.name} {'supports' if hw.accelerator.bf16 else 'lacks'} bf16"
    reasons["dtype"] = Choice(w.dtype, dtype_why)
    return reasons


def layout_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation, decision: Decision, spec: PlannerSpec,
                    limit_gb: float) -> dict[str, Choice]:
    """Why this backend and preset, the backend's own reasons, and the data-parallel size."""
    layout = ev.layout
    gpus_used = layout.nodes * layout.gpus_per_node if hw.device == "cuda" else 0
    reasons: dict[str, Choice] = {}
    reasons["backend"] = Choice(layout.backend, _backend_reason(ev, decision, pinned(recipe), limit_gb))
    reasons["preset"] = Choice(layout.preset, ev.candidate.why)
    reasons.update(spec.plan_reasons(layout, recipe.distributed, w))
    reasons["data_parallel"] = Choice(layout.data_parallel, f"{gpus_used or 1} process(es) / model-parallel size "
                                      f"{layout.world_size // max(1, layout.data_parallel)}")
    return reasons


def activation_summary(w: Workload, ev: Evaluation, spec: PlannerSpec) -> str:
    """The activation estimate's terms for one micro batch on the chosen layout."""
    layout = ev.layout
    tokens = ev.micro_batch * w.sequences_per_sample * w.seq_len
    terms = activation_terms(w, tokens, layers=w.model.num_layers, checkpointing=ev.checkpointing,
                             tensor_parallel=layout.tensor_parallel, context_parallel=layout.context_parallel,
                             sequence_parallel=spec.sequence_parallel,
                             fp32_weights=autocast_fp32_weights(w, layout))
    if ev.memory.train_peak:  # the memory table shows the train phase at this moment
        terms += f"; the train phase peaks at {ev.memory.train_peak}"
    return terms


def _backend_reason(ev: Evaluation, decision: Decision, pins: list[str], limit_gb: float) -> str:
    if pins:
        figures = _fit(ev, limit_gb)
        return f"recipe pins {', '.join(pins)}; " + (figures if "tight" in figures else f"fits in {figures}")
    earlier = [e for e in decision.evaluations[: position(decision, ev)] if not e.fits]
    lost = "; ".join(f"{e.layout.label} {e.problem}" for e in earlier[:3])
    head = f"first layout in preference order that fits ({_fit(ev, limit_gb)})"
    return f"{head}; before it: {lost}" if lost else head


def _fit(ev: Evaluation, limit_gb: float) -> str:
    """How the chosen layout fits: within the usable memory, or (a tight fit) only within the
    estimate's accuracy band, above the margin `distributed.memory_headroom` keeps."""
    total = ev.memory.total / GIB
    if total <= limit_gb:
        return f"{total:.1f} of {limit_gb:.1f} GB"
    return f"a tight fit: {total:.1f} GB estimated, {limit_gb:.1f} GB usable with the margin; see the warning"


def position(decision: Decision, ev: Evaluation) -> int:
    """Where the chosen layout stands in the decision's preference order."""
    return next(i for i, e in enumerate(decision.evaluations) if e is ev)
