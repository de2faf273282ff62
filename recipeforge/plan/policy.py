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

Within a tier the backend that needs no extra package comes first; when planning for this machine,
a layout whose package is not installed is passed over while an installed one fits. A pinned
backend, preset, ZeRO stage, offload or parallel size restricts the list to matching layouts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from recipeforge.capabilities import Refusal, capabilities_of, parallel_key, refusals
from recipeforge.plan.hardware import GIB, Hardware
from recipeforge.plan.memory import Layout, MemoryEstimate, estimate
from recipeforge.plan.parallel_layouts import splits
from recipeforge.plan.presets import deepspeed_preset, fsdp_preset, get_preset
from recipeforge.plan.workload import Workload

MICRO_BATCH_CAP = 8  # larger micro batches rarely raise throughput for LLM-length sequences


@dataclass(frozen=True)
class Candidate:
    """A layout with its place in the preference order and what it costs in communication."""

    layout: Layout
    tier: int
    why: str  # what this layout does, for reasons and runners-up


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


def backend_installed(backend: str) -> bool:
    """Whether the package behind `backend` can be imported here (looked up, never imported)."""
    module = capabilities_of(backend).package
    if module is None:
        return True
    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        return False
    if "." in module:  # a namespace package: ask the installed distributions instead of importing
        from importlib import metadata

        try:
            metadata.version("megatron-bridge")
        except metadata.PackageNotFoundError:
            return False
    return True


def install_hint(backend: str) -> str:
    """The pip command that installs what `backend` needs ("" when nothing)."""
    extra = capabilities_of(backend).extra
    return f"pip install 'recipeforge[{extra}]'" if extra else ""


# ----------------------------------------------------------------------------- candidates

def layout_refusals(w: Workload, layout: Layout, device: str) -> list[Refusal]:
    """What the backend of `layout` refuses for this workload (its capability record decides)."""
    found = refusals(capabilities_of(layout.backend), stage=w.stage, device=device, adapter=w.adapter,
                     quant_bits=w.quant_bits, offload=layout.offload, zero_stage=layout.zero_stage,
                     optimizer=w.optimizer,
                     model_parallel=parallel_key(layout.tensor_parallel, layout.pipeline_parallel,
                                                 layout.context_parallel))
    return found + [Refusal(key, message) for backend, key, message in w.setting_refusals
                    if backend == layout.backend]


def deepspeed_cpu_settings(dist) -> tuple[int, str, str]:
    """(ZeRO stage, offload, preset) of DeepSpeed on the CPU: the recipe's preset or pins, else ZeRO-2
    (ZeRO-3 for a pinned parameter offload) without offload (memory is not what a CPU run is short of)."""
    if dist.preset:
        p = get_preset(dist.preset, backend="deepspeed")
        zero, offload = p.zero_stage, p.offload
    else:
        offload = dist.offload if dist.offload != "auto" else "none"
        zero = dist.zero_stage if dist.zero_stage != "auto" else (3 if offload == "optimizer+params" else 2)
    return zero, offload, deepspeed_preset(zero, offload)


def fsdp_cpu_settings(dist) -> tuple[str, str, str]:
    """(sharding, offload, preset) of FSDP2 on the CPU: the recipe's preset or pins, else full sharding
    without offload. One machine has no replicas to shard within, so hybrid sharding is full sharding."""
    if dist.preset:
        p = get_preset(dist.preset, backend="fsdp")
        sharding, offload = p.sharding, p.offload
    else:
        sharding, offload = dist.fsdp_sharding, dist.offload if dist.offload != "auto" else "none"
    sharding = "full_shard" if sharding == "hybrid_shard" else sharding
    return sharding, offload, fsdp_preset(sharding, offload)


def _cpu_candidate(backend: str, dist) -> Candidate:
    if backend == "fsdp":
        sharding, offload, preset = fsdp_cpu_settings(dist)
        return Candidate(Layout("fsdp", preset, offload=offload, fsdp_sharding=sharding, nodes=1, gpus_per_node=0),
                         1, f"FSDP2 ({sharding}) on the CPU (gloo), one process planned")
    if backend == "deepspeed":
        zero, offload, preset = deepspeed_cpu_settings(dist)
        return Candidate(Layout("deepspeed", preset, zero_stage=zero, offload=offload, nodes=1, gpus_per_node=0),
                         1, f"DeepSpeed ZeRO-{zero} on the CPU (gloo), one process planned")
    if backend == "single":
        return Candidate(Layout("single", None, nodes=1, gpus_per_node=0), 0, "one process on the CPU")
    # gloo on the CPU; the launcher sets the process count
    return Candidate(Layout(backend, None, nodes=1, gpus_per_node=0), 1,
                     f"{backend} on the CPU (gloo), one process planned")


def candidate_list(w: Workload, hw: Hardware, dist) -> list[Candidate]:
    """Layouts to try, in preference order, honouring the recipe's pins. Only layouts whose backend's
    capability record accepts the workload are candidates (`recipeforge.capabilities`)."""
    if hw.device == "cpu":
        # One process is planned; `plan.world` spreads it over the processes a launch starts. In auto
        # mode the first backend that runs the pinned settings wins (DeepSpeed for a pinned offload).
        if dist.backend != "auto":
            backends: tuple[str, ...] = (dist.backend,)
        elif dist.preset:
            backends = (get_preset(dist.preset).backend,)
        else:
            backends = ("single", "ddp", "deepspeed")
        for backend in backends:
            candidate = _cpu_candidate(backend, dist)
            pinned_offload = dist.offload in ("auto", candidate.layout.offload)
            if pinned_offload and not layout_refusals(w, candidate.layout, "cpu"):
                return [candidate]
        return []
    out = [c for c in _all_layouts(w, hw, pinned=dist.backend != "auto", dist=dist)
           if not layout_refusals(w, c.layout, hw.device)]
    if dist.backend != "auto":
        out = [c for c in out if c.layout.backend == dist.backend]
    if dist.preset:
        out = [c for c in out if c.layout.preset == dist.preset]
    if dist.zero_stage != "auto":
        out = [c for c in out if c.layout.zero_stage == dist.zero_stage]
    if dist.offload != "auto":  # "none" forbids offload, the others pin it
        out = [c for c in out if c.layout.offload == dist.offload]
    out = [c for c in out if _matches_sizes(c.layout, dist)]
    if dist.backend == "fsdp" and not dist.preset:  # a preset names its own sharding
        # pinned replicas shard inside each replica: hybrid sharding, whatever fsdp_sharding says
        replicas = (dist.pinned_size("data_parallel_replicate") or 1) > 1
        out = [c for c in out if c.layout.fsdp_sharding == dist.fsdp_sharding
               or (replicas and c.layout.dp_replicate > 1)]
    return out


def _matches_sizes(layout: Layout, dist) -> bool:
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
        # replicate / shard sizes are FSDP2's mesh (Accelerate's dp_replicate_size / dp_shard_size)
        if layout.backend != "fsdp":
            return False
        if replicate is not None and layout.dp_replicate != replicate:
            return False
        if shard is not None and layout.data_parallel // layout.dp_replicate != shard:
            return False
    return True


def known_presets(w: Workload, hw: Hardware, backend: str | None = None) -> list[str]:
    """Preset names available for `hw` (for hints on an unknown `distributed.preset`)."""
    names = [c.layout.preset for c in _all_layouts(w, hw, pinned=True)
             if c.layout.preset and (backend in (None, "auto") or c.layout.backend == backend)]
    return list(dict.fromkeys(names))


def _all_layouts(w: Workload, hw: Hardware, *, pinned: bool, dist=None) -> list[Candidate]:
    g, nodes, per_node = hw.num_gpus, hw.nodes, hw.gpus_per_node
    common = dict(nodes=nodes, gpus_per_node=per_node)
    one = dict(nodes=1, gpus_per_node=1)
    out: list[Candidate] = []

    def add(tier, why, **kw):
        base = common if kw.pop("all_gpus", True) else one
        out.append(Candidate(Layout(**{**base, **kw}), tier, why))

    if g == 1 or pinned:
        add(0, "the whole model on one GPU", backend="single", preset=None, all_gpus=False)
    if g > 1 or pinned:
        add(1, "a full replica per GPU; one gradient all-reduce per step", backend="ddp", preset=None, data_parallel=g)
    if g > 1 or pinned:
        add(2, "optimizer states and gradients sharded; weights gathered once per step",
            backend="fsdp", preset="fsdp_shard_grad_op", data_parallel=g, fsdp_sharding="shard_grad_op")
        add(2, "optimizer states sharded (ZeRO-2 also shards gradients); same traffic as DDP",
            backend="deepspeed", preset="zero2", data_parallel=g, zero_stage=2)
        if pinned:
            add(2, "optimizer states sharded; same traffic as DDP", backend="deepspeed", preset="zero1",
                data_parallel=g, zero_stage=1)
            add(1, "DeepSpeed without partitioning", backend="deepspeed", preset="zero0", data_parallel=g, zero_stage=0)
        add(3, "weights, gradients and optimizer states sharded; weights gathered per layer (1.5x DDP traffic)",
            backend="fsdp", preset="fsdp_full_shard", data_parallel=g, fsdp_sharding="full_shard")
        if nodes > 1 and pinned:
            add(3, "sharded within each node, replicated across nodes", backend="fsdp", preset="fsdp_hybrid_shard",
                data_parallel=g, fsdp_sharding="hybrid_shard", dp_replicate=nodes)
        add(3, "ZeRO-3: weights, gradients and optimizer states sharded; 1.5x DDP traffic",
            backend="deepspeed", preset="zero3", data_parallel=g, zero_stage=3)
    megatron = g > 1 and (pinned or (w.stage == "pretrain" and not w.model.is_moe and w.full_finetune))
    for offload in ("none", "optimizer"):
        if offload == "optimizer" and g > 1 and dist is not None:
            _add_parallel_fsdp(out, w, hw, dist)
        if megatron:
            for tp, pp in _megatron_sizes(w, hw, every_split=pinned):
                suffix = "_offload" if offload != "none" else ""
                why = (f"tensor parallel {tp} inside a node, pipeline parallel {pp}"
                       + ("; optimizer on the CPU" if offload != "none" else ""))
                add(4 if offload == "none" else 5, why, backend="megatron", preset=f"tp{tp}_pp{pp}{suffix}",
                    data_parallel=g // (tp * pp), tensor_parallel=tp, pipeline_parallel=pp, offload=offload)
    add(6, "ZeRO-Offload: optimizer states and step on the CPU, 16-bit weights on each GPU",
        backend="deepspeed", preset="zero2_offload", data_parallel=g, zero_stage=2, offload="optimizer")
    add(6, "ZeRO-3 with the optimizer states and step on the CPU",
        backend="deepspeed", preset="zero3_offload", data_parallel=g, zero_stage=3, offload="optimizer")
    add(7, "FSDP2 with parameters, gradients and optimizer states in CPU memory",
        backend="fsdp", preset="fsdp_full_shard_offload", data_parallel=g, fsdp_sharding="full_shard",
        offload="optimizer+params")
    add(7, "ZeRO-3 with optimizer states and parameters in CPU memory (ZeRO-Infinity style)",
        backend="deepspeed", preset="zero3_offload_params", data_parallel=g, zero_stage=3, offload="optimizer+params")
    return out


def _add_parallel_fsdp(out: list[Candidate], w: Workload, hw: Hardware, dist) -> None:
    """FSDP2 with tensor and/or context parallel (`plan.parallel_layouts.splits`), after the layouts that
    shard only data: they are planned when a model's layers or a sequence's activations need them."""
    found, _ = splits(w.model, hw, dist, seq_len=w.seq_len, stage=w.stage, adapter=w.adapter,
                      attention=w.attn_implementation, packing=w.packing)
    for s in found:
        parts = []
        if s.tensor_parallel > 1:
            parts.append(f"tensor parallel {s.tensor_parallel} (the model's tensor-parallel plan) splits the "
                         "heads, MLP columns and their activations")
        if s.context_parallel > 1:
            parts.append(f"context parallel {s.context_parallel} (ring attention) splits each sequence and its "
                         "activations")
        why = "; ".join(parts) + f"; FSDP2 shards over {s.dp_shard}" + (
            f" x {s.dp_replicate} replicas" if s.dp_replicate > 1 else "")
        out.append(Candidate(Layout("fsdp", "fsdp_hybrid_shard" if s.dp_replicate > 1 else "fsdp_full_shard",
                                    data_parallel=s.data_parallel, tensor_parallel=s.tensor_parallel,
                                    context_parallel=s.context_parallel, dp_replicate=s.dp_replicate,
                                    fsdp_sharding="hybrid_shard" if s.dp_replicate > 1 else "full_shard",
                                    nodes=hw.nodes, gpus_per_node=hw.gpus_per_node), 4, why))


def _megatron_sizes(w: Workload, hw: Hardware, every_split: bool = False) -> list[tuple[int, int]]:
    """(TP, PP) pairs, smallest model-parallel size first. For automatic planning each size uses the
    largest tensor-parallel degree that stays inside a node and divides the attention heads, the rest
    becomes pipeline stages (Narayanan et al. 2021: TP within a node, PP across nodes); a pinned
    split may be any valid pair (`every_split`)."""
    m, g = w.model, hw.num_gpus
    valid_tp = [tp for tp in (1, 2, 4, 8) if tp <= hw.gpus_per_node and not m.num_heads % tp
                and not m.num_kv_heads % tp]
    sizes = []
    for mp in range(1, g + 1):
        if g % mp:
            continue
        tps = [t for t in valid_tp if mp % t == 0]
        for tp in sorted(tps, reverse=True)[: None if every_split else 1]:
            if mp // tp <= m.num_layers:
                sizes.append((tp, mp // tp))
    return sizes


# ----------------------------------------------------------------------------- fitting

def evaluate(c: Candidate, w: Workload, hw: Hardware, train, headroom: float) -> Evaluation:
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
    if layout.backend == "megatron":
        # Megatron-Bridge trains packed rows one per micro batch (`components.megatron_data`); a pinned
        # micro batch other than 1 is refused with the recipe (`config.schema.megatron_fields`).
        micros = [1]
    elif isinstance(train.micro_batch_size, int):
        micros = [train.micro_batch_size]
    else:
        cap = min(MICRO_BATCH_CAP, per_rank) if per_rank else 1
        micros = [b for b in range(cap, 0, -1) if per_rank and per_rank % b == 0] or [1]
    ckpts = [train.gradient_checkpointing] if isinstance(train.gradient_checkpointing, bool) else [False, True]

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
    _, micro, ckpt, mem = best
    ev = Evaluation(c, False, micro, max(1, global_batch // (micro * dp)), ckpt, mem, limit, cpu_limit, tried=tried)
    if mem.total > limit:
        ev.problem = f"needs {mem.total / GIB:.1f} GB per GPU, {limit / GIB:.1f} GB usable"
    else:
        ev.problem = (f"needs {mem.cpu_per_node / GIB:.0f} GB of host RAM per node, "
                      f"{cpu_limit / GIB:.0f} GB usable")
    return ev


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


def decide(w: Workload, hw: Hardware, dist, train) -> Decision:
    """Evaluate the candidates in order; the first that fits wins. When planning for this machine
    (probed hardware) in auto mode, a layout whose package is not installed gives way to the first
    fitting layout that can run here. A target described by a spec says nothing about what is
    installed there, so it keeps the preferred layout; either way a chosen layout whose package is
    missing here carries a warning naming the extra to install."""
    evaluations = [evaluate(c, w, hw, train, dist.memory_headroom) for c in candidate_list(w, hw, dist)]
    fitting = [e for e in evaluations if e.fits]
    if not fitting:
        return Decision(None, evaluations)
    chosen = fitting[0]
    if dist.backend == "auto" and hw.source == "probe":
        runnable = [e for e in fitting if backend_installed(e.layout.backend)]
        chosen = runnable[0] if runnable else chosen
    warnings: list[str] = []
    if not backend_installed(chosen.layout.backend):
        warnings.append(f"{chosen.layout.backend} is not installed here: {install_hint(chosen.layout.backend)}")
    return Decision(chosen, evaluations, warnings)
