"""The planner's mixture-of-experts terms: which implementation runs the experts, the expert-parallel
size (searched with the layout the planner chose) and what it costs per GPU.

Expert parallel (EP) splits each MoE layer's routed experts over N GPUs: a rank holds E/N experts and
the tokens routed to the others go there and back by all-to-all (transformers' expert-parallel plan,
`transformers/distributed/expert_parallel.py`, the `ep_size` of its `DistributedConfig`). It composes
with FSDP2 only: the experts' replicas (world / N of them) shard each rank's experts further, so the
resident expert state per GPU is the same as under plain FSDP. What EP changes is the traffic and the
gathered buffers: FSDP all-gathers every expert of a layer before it runs (forward, recomputation and
backward), EP all-gathers only its own E/N over its replicas and sends tokens instead. The search
compares, for each N that divides the experts and the FSDP group of one node, the bytes a GPU moves per
optimizer step (expert all-gathers plus token all-to-all) and the memory EP adds (dispatch buffers and
the imbalance headroom) or frees (smaller gathered layers), and picks the least traffic that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import GIB
from recipeforge.plan.expert_lora import experts_adapted
from recipeforge.plan.types import Choice

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.models import ModelSpec
    from recipeforge.plan.policy import Evaluation
    from recipeforge.plan.workload import Workload

KEY = "distributed.expert_parallel"
# transformers' expert parallel drops no token (no capacity factor): a rank's experts can receive more
# than the mean share. The plan reserves this much over the mean for the routed tokens' buffers.
IMBALANCE_HEADROOM = 1.25


@dataclass(frozen=True)
class ExpertTerms:
    """One expert-parallel size on the chosen layout: bytes per GPU and bytes moved per step."""

    size: int
    experts_per_rank: int
    resident: float        # expert weights (and states) held per GPU
    gathered: float        # one MoE layer's experts unsharded, with the next one prefetched
    router: float          # router weights plus every layer's router logits kept for the aux loss (fp32)
    all_to_all: float      # dispatch send + receive buffers of one layer (0 without EP)
    headroom: float        # routed tokens over the mean share (imbalance), 0 without EP
    lora_merged: float     # expert LoRA: the merged W + BA (and BA in fp32) peft builds per layer, kept for backward
    traffic: float         # bytes a GPU sends per optimizer step: expert all-gathers + token all-to-all
    delta: float           # memory over the planner's estimate for EP 1

    def describe(self) -> str:
        return (f"EP {self.size}: {self.experts_per_rank} experts per rank, expert weights {_gb(self.resident)} GB "
                f"resident, {_gb(self.gathered)} GB gathered per layer, router {_gb(self.router)} GB, "
                f"all-to-all {_gb(self.all_to_all)} GB, imbalance headroom {_gb(self.headroom)} GB, "
                + (f"expert LoRA merged weights {_gb(self.lora_merged)} GB, " if self.lora_merged else "") +
                f"{_gb(self.traffic)} GB moved per step")


def _gb(b: float) -> str:
    return f"{b / GIB:.2f}"


def implementation(recipe: Recipe, hw: Hardware) -> Choice:
    """Which experts implementation runs (transformers' `experts_implementation`)."""
    chosen = recipe.moe.experts_implementation
    if chosen != "auto":
        return Choice(chosen, "recipe sets it (moe.experts_implementation)")
    if hw.device == "cpu":
        return Choice("grouped_mm", "auto: transformers' default, torch's grouped GEMM (a CPU kernel from torch 2.9; "
                                    "weights not 16-byte aligned fall back to a per-expert loop)")
    acc = hw.accelerator
    if acc is not None and acc.vendor == "nvidia" and not acc.bf16:
        return Choice("grouped_mm", f"auto: transformers' default; {acc.name} is older than compute capability 8.0, "
                                    "where torch has no grouped GEMM: transformers runs its per-expert fallback")
    return Choice("grouped_mm", "auto: transformers' default, one torch grouped GEMM over a layer's experts "
                                "(compute capability 8.0+) instead of a Python loop over them")


def expert_reasons(recipe: Recipe, w: Workload, hw: Hardware, ev: Evaluation) -> dict[str, Choice]:
    """The plan's MoE decisions: `experts` (implementation), `expert_parallel` (size and why) and
    `expert_memory` (the terms of the chosen size). Refuses an expert-parallel size the model or the
    layout cannot run, at its key."""
    m, pinned = w.model, recipe.distributed.expert_parallel
    if not m.is_moe:
        if pinned != "auto" and int(pinned) > 1:
            raise RecipeError(f"{recipe.model.name_or_path} has no routed experts to split", key=KEY,
                              hint="set distributed.expert_parallel: 1 (expert parallel is for mixture-of-experts "
                                   "models)")
        return {}
    _check_lora(recipe)
    layout = ev.layout
    group = _fsdp_group(layout, hw)
    options = [n for n in range(1, min(group, m.num_experts) + 1) if m.num_experts % n == 0 and group % n == 0]
    lora = experts_adapted(recipe)
    terms = {n: _terms(w, ev, n, lora=lora) for n in options}
    reasons = {"experts": implementation(recipe, hw)}
    if recipe.adapter.type != "none":
        reasons["moe_lora"] = lora_reason(recipe)
    if pinned != "auto" and int(pinned) > 1 and hw.device != "cuda":
        size = int(pinned)
        reasons["expert_parallel"] = _cpu_pinned(recipe, m, size)
        terms[size] = _terms(w, ev, size, lora=lora)
        t = terms[size]
        reasons["expert_memory"] = Choice(round((t.resident + t.gathered + t.router + t.all_to_all + t.headroom
                                                 + t.lora_merged) / GIB, 2),
                                          t.describe() + f"; peak with it {(ev.memory.total + t.delta) / GIB:.1f} GB")
        return reasons
    if pinned != "auto" and int(pinned) > 1:
        size = int(pinned)
        _check_pinned(recipe, m, layout, hw, size, options)
        fits = ev.memory.total + terms[size].delta <= ev.limit
        if not fits:
            raise RecipeError(f"expert parallel {size} needs {(ev.memory.total + terms[size].delta) / GIB:.1f} GB per "
                              f"GPU, {ev.limit / GIB:.1f} GB usable ({terms[size].describe()})", key=KEY,
                              hint=f"try distributed.expert_parallel: auto (sizes {options})")
        reasons["expert_parallel"] = Choice(size, f"recipe sets it; {_compare(terms, size)}")
    else:
        size, why = _choose(terms, ev, layout, hw, auto=pinned == "auto", adapter=recipe.adapter.type)
        reasons["expert_parallel"] = Choice(size, why)
    t = terms[size] if runs_expert_parallel(layout) else _held(w, terms[1])
    peak = ev.memory.total + t.delta
    reasons["expert_memory"] = Choice(round((t.resident + t.gathered + t.router + t.all_to_all + t.headroom
                                             + t.lora_merged) / GIB, 2),
                                      t.describe() + f"; peak with it {peak / GIB:.1f} GB")
    return reasons


def expert_warnings(reasons: dict[str, Choice], ev: Evaluation) -> list[str]:
    """A warning when the MoE terms the layout's estimate leaves out take the peak past the usable
    memory (the layout was chosen without them)."""
    mem = reasons.get("expert_memory")
    if mem is None:
        return []
    peak = float(mem.reason.rsplit("peak with it ", 1)[1].split(" GB")[0])
    limit = ev.limit / GIB
    if peak <= limit:
        return []
    return [f"with its MoE terms (expert_memory) the peak is {peak:.1f} GB per GPU, over the {limit:.1f} GB usable: "
            "the expert LoRA's merged weights and the routers' logits are not in the layout's estimate; set "
            "train.gradient_checkpointing: true, distributed.backend: fsdp with distributed.expert_parallel: auto, "
            "or moe.lora_experts: false"]


def lora_reason(recipe: Recipe) -> Choice:
    """What LoRA adapts on an MoE model, and why."""
    a, flag = recipe.adapter, recipe.moe.lora_experts
    if experts_adapted(recipe):
        return Choice("attention+experts", "one low-rank pair per routed expert on the fused expert weights (peft "
                                           "target_parameters), routers left out")
    why = ("moe.lora_experts: false" if flag is False else
           f"adapter.dropout is {a.dropout} and expert adapters take none (set adapter.dropout: 0 to adapt them)")
    return Choice("attention", f"routed experts frozen: {why}; routers left out")


def _check_lora(recipe: Recipe) -> None:
    a = recipe.adapter
    if a.type != "none" and recipe.moe.lora_experts and a.dropout:
        raise RecipeError(f"LoRA on the routed experts (peft target_parameters) takes no dropout, and adapter.dropout "
                          f"is {a.dropout}", key="adapter.dropout",
                          hint="set adapter.dropout: 0, or moe.lora_experts: false (LoRA on attention only)")


def _fsdp_group(layout: Layout, hw: Hardware) -> int:
    """GPUs of one node that shard the model together on an FSDP2 layout (a node's GPUs for another
    backend, as FSDP2 would use them; 1 on the CPU): the sizes EP can take, all-to-all kept on the
    node's own links."""
    if hw.device != "cuda":
        return 1
    if not runs_expert_parallel(layout):
        return max(1, layout.gpus_per_node)
    per_node = max(1, layout.gpus_per_node // max(1, layout.tensor_parallel * layout.context_parallel))
    shard = max(1, layout.data_parallel // max(1, layout.dp_replicate))
    return min(per_node, shard)


def _cpu_pinned(recipe: Recipe, m: ModelSpec, size: int) -> Choice:
    """A pinned size on the CPU: the experts split over `size` gloo processes (the launch spreads the
    one-process plan over them: `plan.world` checks the process count)."""
    if m.num_experts % size:
        divisors = [n for n in range(2, m.num_experts + 1) if m.num_experts % n == 0]
        raise RecipeError(f"{m.num_experts} experts per layer do not split evenly over {size} processes", key=KEY,
                          hint=f"use one of {divisors}, or 1")
    return Choice(size, f"recipe sets it: {m.num_experts // size} of the {m.num_experts} experts of each MoE layer "
                        f"per process, tokens exchanged by all-to-all over gloo (transformers' expert-parallel plan)")


def _check_pinned(recipe: Recipe, m: ModelSpec, layout: Layout, hw: Hardware, size: int, options: list[int]) -> None:
    if not runs_expert_parallel(layout):
        raise RecipeError(f"expert parallel composes with FSDP2, and the plan chose {layout.backend}", key=KEY,
                          hint="set distributed.backend: fsdp, or distributed.expert_parallel: 1")
    if m.num_experts % size:
        raise RecipeError(f"{m.num_experts} experts per layer do not split evenly over {size} GPUs", key=KEY,
                          hint=f"use one of {options}")
    if size not in options:
        raise RecipeError(f"expert parallel {size} does not divide the {max(options)} GPUs of a node that shard the "
                          f"model together", key=KEY, hint=f"use one of {options}")


def _terms(w: Workload, ev: Evaluation, n: int, *, lora: bool = False) -> ExpertTerms:
    m, layout = w.model, ev.layout
    p = 4 if w.dtype == "fp32" else 2
    world = max(1, layout.world_size // max(1, layout.tensor_parallel * layout.pipeline_parallel))
    h, i, e, k = m.hidden_size, m.moe_intermediate_size, m.num_experts, m.experts_per_token
    per_expert = 3 * h * i * p
    experts_bytes = m.moe_layers * e * per_expert
    sharded = True  # the terms are FSDP2's (EP composes with it), also when the plan chose another backend
    full = w.adapter == "none"
    # full fine-tune: weights + grads + fp32 Adam moments (and masters) for the experts as well
    state = experts_bytes * ((1 + 1 + 8 / p + (4 / p if p == 2 else 0)) if full else 1)
    resident = state / world if sharded else state / n
    gathered = 2 * (e // n) * per_expert if sharded else 0.0
    tokens = ev.micro_batch * w.seq_len * w.sequences_per_sample
    router = m.moe_layers * (e * h * p + tokens * e * 4)
    routed = tokens * k * h * p
    a2a = 2 * routed if n > 1 else 0.0
    kept = 1 if ev.checkpointing else m.moe_layers
    headroom = (IMBALANCE_HEADROOM - 1) * tokens * k * (h + 3 * i) * p * kept if n > 1 else 0.0
    steps = ev.accumulation
    passes = 3 if ev.checkpointing else 2  # forward, recomputed forward, backward
    replicas = max(1, world // n)
    gather_traffic = (experts_bytes / n) * (replicas - 1) / replicas * passes * (steps if sharded else 0)
    grad_traffic = (experts_bytes / n) * (replicas - 1) / replicas if full else 0.0
    a2a_traffic = m.moe_layers * routed * 4 * (n - 1) / n * steps  # dispatch + combine, forward and backward
    base_gathered = 2 * e * per_expert if sharded else 0.0
    # peft's expert adapters are a parametrization: each forward builds W + B@A for the layer's experts
    # (B@A in the adapter's fp32 first), and the merged weight is saved for the grouped GEMM's backward
    merged = kept * (e // n) * 3 * h * i * (p + 4) if lora else 0.0
    delta = gathered - base_gathered + a2a + headroom + merged
    return ExpertTerms(n, e // n, resident, gathered, router, a2a, headroom, merged,
                       gather_traffic + grad_traffic + a2a_traffic, delta)


def _held(w: Workload, fsdp: ExpertTerms) -> ExpertTerms:
    """EP 1 on a backend that keeps a full replica per GPU: every expert resident, nothing gathered."""
    from dataclasses import replace

    m = w.model
    p = 4 if w.dtype == "fp32" else 2
    experts_bytes = m.moe_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size * p
    return replace(fsdp, resident=experts_bytes if w.adapter != "none" else fsdp.resident, gathered=0.0, traffic=0.0,
                   delta=fsdp.lora_merged)


def _compare(terms: dict[int, ExpertTerms], size: int) -> str:
    rest = [f"{n}: {_gb(t.traffic)} GB/step" for n, t in terms.items() if n != size]
    return terms[size].describe() + (f" (other sizes: {', '.join(rest)})" if rest else "")


def runs_expert_parallel(layout: Layout) -> bool:
    """Whether the backend of `layout` runs expert parallel (its capability record lists the size)."""
    return "expert_parallel" in layout.capabilities.parallel_sizes


def _choose(terms: dict[int, ExpertTerms], ev: Evaluation, layout: Layout, hw: Hardware, *,
            auto: bool, adapter: str = "none") -> tuple[int, str]:
    backend = layout.backend
    if hw.device != "cuda":
        return 1, ("one process holds every expert (distributed.expert_parallel: N with --nproc-per-node N splits "
                   "them over gloo processes)")
    if auto and adapter != "none" and runs_expert_parallel(layout):
        best = min(terms, key=lambda n: (terms[n].traffic, n))
        return 1, (f"auto: an adapter run keeps every expert on each GPU (expert parallel trains full fine-tunes: "
                   f"peft's adapters need whole weights, docs/moe.md); for a full fine-tune: {_compare(terms, best)}")
    if not runs_expert_parallel(layout):
        best = min(terms, key=lambda n: (terms[n].traffic, n))
        return 1, (f"{backend} holds every expert on every GPU and gathers none; expert parallel composes with FSDP2 "
                   f"(distributed.backend: fsdp), where the search gives: {_compare(terms, best)}")
    fitting = {n: t for n, t in terms.items() if ev.memory.total + t.delta <= ev.limit}
    best = min(fitting, key=lambda n: (fitting[n].traffic, n)) if fitting else 1
    if not auto:
        return 1, (f"recipe keeps it at 1 (distributed.expert_parallel: auto would choose {best}); "
                   + _compare(terms, best))
    return best, f"auto: least traffic per step that fits; {_compare(terms, best)}"
