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
from typing import TYPE_CHECKING

from recipeforge.capabilities import BackendCapabilities
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.memory import Layout, MemoryEstimate, estimate
from recipeforge.plan.candidates import candidate_list
from recipeforge.plan.candidates import known_presets as known_presets  # re-exported: the plan's hints
from recipeforge.plan.candidates import pinned_refusals as pinned_refusals  # re-exported: the plan's errors
from recipeforge.plan.optim_in_backward import in_backward_micro_batches
from recipeforge.plan.planners import Planners
from recipeforge.plan.workload import Workload
from recipeforge.stage_specs import stage_spec

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
        least = stage_spec(w.stage).min_micro_batch
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
