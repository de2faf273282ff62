"""Which layouts the planner tries, in preference order: every registered backend's offer, narrowed by the
recipe's pins and refused where the backend's capability record or the recipe's method cannot run it
(`plan.policy` evaluates them and picks the first that fits)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from recipeforge.capabilities import Refusal, parallel_key, refusals
from recipeforge.plan.optim_in_backward import in_backward_refusals
from recipeforge.plan.presets import get_preset
from recipeforge.plan.whole_linears import whole_linear_refusals

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.plan.backend_spec import Candidate
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.workload import Workload


def layout_refusals(w: Workload, layout: Layout, device: str) -> list[Refusal]:
    """What the backend of `layout` refuses for this workload (its capability record decides)."""
    found = refusals(layout.capabilities, stage=w.stage, device=device, adapter=w.adapter,
                     quant_bits=w.quant_bits, offload=layout.offload, zero_stage=layout.zero_stage,
                     optimizer=w.optimizer,
                     model_parallel=parallel_key(layout.tensor_parallel, layout.pipeline_parallel,
                                                 layout.context_parallel))
    return found + [Refusal(key, message) for backend, key, message in w.setting_refusals
                    if backend == layout.backend] + in_backward_refusals(w, layout) + whole_linear_refusals(
        w.whole_linears, tensor_parallel=layout.tensor_parallel, shards_weights=layout.spec.shards_weights(layout),
        layout_name=f"{layout.backend} layout" + (f" ({layout.preset})" if layout.preset else ""))


def cpu_backends(dist: DistributedConfig, planners: Planners) -> list[str]:
    """The backends a CPU plan tries, in order: the pinned one (or the pinned preset's), else every
    backend that offers itself for the CPU (`cpu_preference`)."""
    if dist.backend != "auto":
        return [dist.backend]
    if dist.preset:
        return [get_preset(dist.preset).backend]
    return auto_cpu_backends(planners)


def auto_cpu_backends(planners: Planners) -> list[str]:
    """The backends that offer themselves for a CPU run in auto mode, in their `cpu_preference` order."""
    offered = [n for n, spec in planners.items() if getattr(spec, "cpu_preference", None) is not None]
    # every name offered has a preference (filtered above)
    return sorted(offered, key=lambda n: cast(int, planners[n].cpu_preference))


def candidate_list(w: Workload, hw: Hardware, dist: DistributedConfig, planners: Planners) -> list[Candidate]:
    """Layouts to try, in preference order, honouring the recipe's pins. Every registered backend
    offers its own (`PlannerSpec.candidates`); only layouts whose backend's capability record accepts
    the workload are candidates (`recipeforge.capabilities`)."""
    accepted = [c for c in pinned_layouts(w, hw, dist, planners) if not layout_refusals(w, c.layout, hw.device)]
    # On the CPU one process is planned (`plan.world` spreads it over the processes a launch starts): in
    # auto mode the first backend that runs the pinned settings wins (DeepSpeed for a pinned offload).
    return accepted[:1] if hw.device == "cpu" else accepted


def pinned_refusals(w: Workload, hw: Hardware, dist: DistributedConfig, planners: Planners) -> list[Refusal]:
    """Why each layout the pins allow was refused, in preference order: what to say when no candidate is
    left (`candidate_list`)."""
    return [r for c in pinned_layouts(w, hw, dist, planners) for r in layout_refusals(w, c.layout, hw.device)]


def pinned_layouts(w: Workload, hw: Hardware, dist: DistributedConfig, planners: Planners) -> list[Candidate]:
    """Every layout the recipe's pins allow, in preference order, before the capability records refuse any."""
    if hw.device == "cpu":
        out = [planners.cpu_candidate(backend, dist) for backend in cpu_backends(dist, planners)]
        return [c for c in out if dist.offload in ("auto", c.layout.offload)]
    pinned = dist.backend != "auto"
    out = offered_layouts(w, hw, dist, planners, backend=dist.backend if pinned else None)
    if dist.preset:
        out = [c for c in out if c.layout.preset == dist.preset]
    if dist.zero_stage != "auto":
        out = [c for c in out if c.layout.zero_stage == dist.zero_stage]
    if dist.offload != "auto":  # "none" forbids offload, the others pin it
        out = [c for c in out if c.layout.offload == dist.offload]
    out = [c for c in out if _matches_sizes(c.layout, dist)]
    if pinned and not dist.preset:  # a preset names its own settings
        out = [c for c in out if c.layout.spec.matches_pins(c.layout, dist)]
    return out


def offered_layouts(w: Workload, hw: Hardware, dist: DistributedConfig | None, planners: Planners, *,
                    backend: str | None = None) -> list[Candidate]:
    """The layouts every backend (or only `backend`, which is then pinned) offers, in preference order."""
    if backend is None:
        return planners.offered(w, hw, dist, pinned=False)
    return planners.only(backend).offered(w, hw, dist, pinned=True)


def _matches_sizes(layout: Layout, dist: DistributedConfig) -> bool:
    """Whether `layout` has the parallel sizes the recipe pins (``auto`` matches any)."""
    tp, cp = dist.pinned_size("tensor_parallel"), dist.pinned_size("context_parallel")
    replicate, shard = dist.pinned_size("data_parallel_replicate"), dist.pinned_size("data_parallel_shard")
    if tp is not None and layout.tensor_parallel != tp:
        return False
    if cp is not None and layout.context_parallel != cp:
        return False
    if dist.pipeline_parallel > 1 and layout.pipeline_parallel != dist.pipeline_parallel:
        return False
    if tp is not None and tp > 1 and dist.pipeline_parallel == 1 and layout.pipeline_parallel != 1:
        return False  # pinned TP alone: no pipeline stages added
    if replicate is not None or shard is not None:
        # replicate / shard sizes are a device mesh's (FSDP2: Accelerate's dp_replicate_size / dp_shard_size)
        if "data_parallel_replicate" not in layout.capabilities.parallel_sizes:
            return False
        if replicate is not None and layout.dp_replicate != replicate:
            return False
        if shard is not None and layout.data_parallel // layout.dp_replicate != shard:
            return False
    return True


def known_presets(w: Workload, hw: Hardware, planners: Planners, backend: str | None = None) -> list[str]:
    """Preset names available for `hw` (for hints on an unknown `distributed.preset`)."""
    if backend in (None, "auto"):
        offered = planners.offered(w, hw, None, pinned=True)
    else:
        offered = offered_layouts(w, hw, None, planners, backend=backend)
    return list(dict.fromkeys(c.layout.preset for c in offered if c.layout.preset))
