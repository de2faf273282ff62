"""Which layout to run: candidates in order of preference, the first that fits wins.

Order (all GPUs of the target are used; see docs/planner.md for the reasoning):

1. one GPU: ``single``; several: ``ddp`` (a full replica per GPU, one gradient all-reduce)
2. sharded data parallel that keeps weights whole during the step: FSDP2 ``shard_grad_op``, ZeRO-2
3. fully sharded: FSDP2 ``full_shard``, ZeRO-3
4. pretraining of dense models: Megatron tensor/pipeline parallel; then FSDP2 with tensor and/or
   context parallel (`plan.parallel_layouts`: the model's tensor-parallel plan, ring attention),
   smallest TP x CP first; then Megatron with its optimizer on the CPU
5. offload: ZeRO-2 + optimizer offload, ZeRO-3 + optimizer offload, FSDP2 CPU offload,
   ZeRO-3 + optimizer and parameter offload

Each registered backend spec offers its own layouts with their tier (`PlannerSpec.candidates`); the
list above is what the built-ins offer, and a plugin backend slots its layouts in by tier (the
zero_redundancy plugin: after DDP). Within a tier the backend that needs no extra package comes
first; when planning for this machine, a layout whose package is not installed is passed over while
an installed one fits. A pinned backend, preset, ZeRO stage, offload or parallel size restricts the
list to matching layouts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from recipeforge.capabilities import BackendCapabilities, Refusal, parallel_key, refusals
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.memory import Layout, MemoryEstimate, estimate
from recipeforge.plan.optim_in_backward import in_backward_micro_batches, in_backward_refusals
from recipeforge.plan.planners import Planners
from recipeforge.plan.presets import get_preset
from recipeforge.plan.whole_linears import whole_linear_refusals
from recipeforge.plan.workload import Workload
from recipeforge.stage_specs import STAGE_SPECS, Stage

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.train import TrainConfig

MICRO_BATCH_CAP = 8  # larger micro batches rarely raise throughput for LLM-length sequences


@dataclass
class Evaluation:
    """A candidate with the micro batch / checkpointing that fits, or why nothing does."""

    candidate: Candidate
    fits: bool
    micro_batch: int
    accumulation: int
    checkpointing: bool
    memory: MemoryEstimate
    limit: float                       # usable bytes per GPU
    cpu_limit: float                   # usable host bytes per node
    problem: str = ""                  # why it does not fit / cannot run
    tried: list[tuple[int, bool, float]] = field(default_factory=list)  # (micro, checkpointing, bytes)

    @property
    def layout(self) -> Layout:
        return self.candidate.layout

    @property
    def shortfall(self) -> float:
        """Bytes over the GPU limit (or the host limit when only that is exceeded)."""
        gpu = self.memory.total - self.limit
        cpu = self.memory.cpu_per_node - self.cpu_limit
        return max(gpu, cpu, 0.0)


def backend_installed(caps: BackendCapabilities) -> bool:
    """Whether the package behind the backend of `caps` can be imported here (looked up, never imported)."""
    if caps.package is None:
        return True
    if importlib.util.find_spec(caps.package.split(".")[0]) is None:
        return False
    if caps.distribution:  # a namespace package: ask the installed distributions instead of importing
        from importlib import metadata

        try:
            metadata.version(caps.distribution)
        except metadata.PackageNotFoundError:
            return False
    return True


def install_hint(caps: BackendCapabilities) -> str:
    """The pip command that installs what the backend of `caps` needs ("" when nothing)."""
    extra = caps.extra
    return f"pip install 'recipeforge[{extra}]'" if extra else ""


# ----------------------------------------------------------------------------- candidates

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


# ----------------------------------------------------------------------------- fitting

def evaluate(c: Candidate, w: Workload, hw: Hardware, train: TrainConfig, headroom: float) -> Evaluation:
    """Find the micro batch and checkpointing that fit `c`, preferring no recomputation, then the
    largest micro batch that divides the per-rank batch."""
    layout = c.layout
    dp = layout.data_parallel
    gpu_bytes = hw.gpu_memory_gb * GIB
    ram, _ = hw.host_ram_gb()
    if hw.device == "cpu":
        limit, cpu_limit = headroom * ram * GIB, float("inf")
    else:
        limit, cpu_limit = headroom * gpu_bytes, headroom * ram * GIB
    global_batch = train.global_batch_size

    per_rank = global_batch // dp if global_batch % dp == 0 else 0
    fixed = layout.spec.fixed_micro_batch
    if fixed is not None:
        # e.g. Megatron-Bridge trains packed rows one per micro batch; a pinned micro batch other than
        # that is refused with the recipe
        micros = [fixed]
    elif isinstance(train.micro_batch_size, int):
        micros = [train.micro_batch_size]
    else:
        # the stage's least micro batch (KTO: 2); a per-rank batch below it is then a batch problem
        least = STAGE_SPECS[Stage(w.stage)].min_micro_batch
        cap = min(MICRO_BATCH_CAP, per_rank) if per_rank else 1
        micros = [b for b in range(cap, least - 1, -1) if per_rank and per_rank % b == 0] or [least]
        if w.optimizer_in_backward:  # one micro batch per step: its gradients are used as they are made
            micros = in_backward_micro_batches(per_rank)
    # `selective` is checkpointing too (its own activation term, `plan.activations`); `auto` tries without first
    ckpts = [True] if train.gradient_checkpointing == "selective" else \
        [train.gradient_checkpointing] if isinstance(train.gradient_checkpointing, bool) else [False, True]

    tried: list[tuple[int, bool, float]] = []
    best: tuple[float, int, bool, MemoryEstimate] | None = None
    for ckpt in ckpts:
        for micro in micros:
            accumulation = max(1, global_batch // (micro * dp))
            mem = estimate(w, layout, micro, ckpt, accumulation=accumulation,
                           gpu_memory=gpu_bytes if hw.device == "cuda" else 0.0)
            tried.append((micro, ckpt, mem.total))
            if best is None or mem.total < best[0]:
                best = (mem.total, micro, ckpt, mem)
            if mem.total <= limit and mem.cpu_per_node <= cpu_limit:
                ev = Evaluation(c, True, micro, accumulation, ckpt, mem, limit, cpu_limit, tried=tried)
                ev.problem = _batch_problem(global_batch, micro, dp)
                ev.fits = not ev.problem
                return ev
    assert best is not None  # `micros` and `ckpts` are never empty: the loop above ran
    _, micro, ckpt, mem = best
    ev = Evaluation(c, False, micro, max(1, global_batch // (micro * dp)), ckpt, mem, limit, cpu_limit, tried=tried)
    if mem.total > limit:
        ev.problem = f"needs {mem.total / GIB:.1f} GB per GPU, {limit / GIB:.1f} GB usable"
    else:
        ev.problem = (f"needs {mem.cpu_per_node / GIB:.0f} GB of host RAM per node, "
                      f"{cpu_limit / GIB:.0f} GB usable")
    return ev


def within_band(ev: Evaluation, w: Workload, hw: Hardware, train: TrainConfig,
                headroom: float) -> tuple[Evaluation, str] | None:
    """`ev` (a layout that does not fit with the usual margin; its smallest estimate) planned after
    all when the low end of the estimate's accuracy band fits the device (the whole GPU, or the host's
    RAM for a CPU run), with the warning that says so. None when even that end does not fit, or when
    host RAM or the batch arithmetic stands in the way (not a question of the estimate's accuracy)."""
    from recipeforge.plan.accuracy import accuracy_band

    if ev.memory.total <= ev.limit or ev.memory.cpu_per_node > ev.cpu_limit or headroom <= 0:
        return None
    if _batch_problem(train.global_batch_size, ev.micro_batch, ev.layout.data_parallel):
        return None
    capacity = ev.limit / headroom
    band = accuracy_band(w, ev.layout)
    low = ev.memory.total * (1 - band)
    if low > capacity:
        return None
    unit, where = ("GPU", "GPU") if hw.device == "cuda" else ("process", "host RAM")
    return replace(ev, fits=True, problem=""), (
        f"tight fit: the estimate is {ev.memory.total / GIB:.1f} GB per {unit} (±{band:.0%}), above the "
        f"{headroom:.0%} of the {capacity / GIB:.1f} GB {where} the planner fills by default "
        f"({ev.limit / GIB:.1f} GB, distributed.memory_headroom); the low end of the band, {low / GIB:.1f} GB, "
        f"fits. Watch the first steps' memory, or lower data.sequence_len to leave the margin")


def _batch_problem(global_batch: int, micro: int, dp: int) -> str:
    if global_batch % (micro * dp):
        return (f"global batch {global_batch} is not a multiple of micro batch {micro} x {dp} "
                f"data-parallel rank{'s' if dp > 1 else ''}")
    return ""


@dataclass
class Decision:
    """The chosen evaluation, every evaluation in order, and warnings."""

    chosen: Evaluation | None
    evaluations: list[Evaluation]
    warnings: list[str] = field(default_factory=list)


def decide(w: Workload, hw: Hardware, dist: DistributedConfig, train: TrainConfig, planners: Planners) -> Decision:
    """Evaluate the candidates in order; the first that fits wins. When planning for this machine
    (probed hardware) in auto mode, a layout whose package is not installed gives way to the first
    fitting layout that can run here. A target described by a spec says nothing about what is
    installed there, so it keeps the preferred layout; either way a chosen layout whose package is
    missing here carries a warning naming the extra to install."""
    evaluations = [evaluate(c, w, hw, train, dist.memory_headroom) for c in candidate_list(w, hw, dist, planners)]
    fitting = [e for e in evaluations if e.fits]
    warnings: list[str] = []
    if not fitting:
        # Nothing leaves the margin `memory_headroom` keeps: the first layout whose estimate could still
        # fit within the estimate's accuracy band is planned, with a warning that says by how much.
        for i, ev in enumerate(evaluations):
            tight = within_band(ev, w, hw, train, dist.memory_headroom)
            if tight is not None:
                evaluations[i] = tight[0]
                fitting = [tight[0]]
                warnings.append(tight[1])
                break
        else:
            return Decision(None, evaluations)
    chosen = fitting[0]
    if dist.backend == "auto" and hw.source == "probe":
        runnable = [e for e in fitting if backend_installed(e.layout.capabilities)]
        chosen = runnable[0] if runnable else chosen
    if not backend_installed(chosen.layout.capabilities):
        warnings.append(f"{chosen.layout.backend} is not installed here: {install_hint(chosen.layout.capabilities)}")
    return Decision(chosen, evaluations, warnings)
