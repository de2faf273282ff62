"""Tensor- and context-parallel layouts on FSDP2: which (TP, CP, replicate, shard) splits a model and a
sequence can take, and why the others cannot.

Only parallelism that transformers, Accelerate and PyTorch provide is planned:

- tensor parallel: the model's tensor-parallel plan (transformers' ``base_model_tp_plan``: q/k/v and
  gate/up column-wise, o/down row-wise), loaded sharded (``DistributedConfig(tp_size=...)``) with FSDP2
  on the remaining ranks; the Trainer hands Accelerate the matching ``ParallelismConfig``;
- context parallel: PyTorch's ring attention (``torch.distributed.tensor.experimental.context_parallel``)
  through Accelerate's ``ParallelismConfig(cp_size=...)`` on FSDP2, CUDA only;
- replicate / shard: Accelerate's ``dp_replicate_size`` / ``dp_shard_size`` (hybrid sharding).

Pure data: no torch, no transformers (`recipeforge plan` stays light). A test checks the table of
model types with a tensor-parallel plan against the installed transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from recipeforge.config.schema.parallel_rules import (MAX_CONTEXT_PARALLEL, ParallelRefusal,  # noqa: F401
                                                       SLIDING_WINDOW_MODEL_TYPES, context_parallel_refusal)
from recipeforge.stage_specs import Stage, stage_spec, stages_with

if TYPE_CHECKING:
    from recipeforge.capabilities import BackendCapabilities
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.memory import Layout
    from recipeforge.plan.models import ModelSpec
    from recipeforge.plan.planners import Planners
    from recipeforge.plan.types import Choice
    from recipeforge.plan.workload import Workload

# Model types whose transformers (5.x) config class defines `base_model_tp_plan`; GPT-2 has none.
TP_PLAN_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi3", "phi", "olmo2", "starcoder2", "deepseek_v3",
})
SIZES = (1, 2, 4, 8, 16, 32, 64)


def tensor_parallel_refusal(model: ModelSpec, tp: int, *, gpus_per_node: int | None = None) -> ParallelRefusal | None:
    """Why `model` (a `plan.models.ModelSpec`) cannot be split `tp` ways, or None."""
    if tp <= 1:
        return None
    key = "distributed.tensor_parallel"
    if model.model_type not in TP_PLAN_MODEL_TYPES:
        return ParallelRefusal(key, f"model type {model.model_type} has no tensor-parallel plan in transformers "
                                    "(no base_model_tp_plan in its config)",
                               "set distributed.tensor_parallel: 1 (FSDP alone), or use a Llama/Qwen/Mistral-style model")
    if model.num_heads % tp:
        return ParallelRefusal(key, f"tensor_parallel {tp} does not divide the model's {model.num_heads} attention "
                                    "heads", f"use a divisor of {model.num_heads}")
    if model.num_kv_heads % tp:
        return ParallelRefusal(key, f"tensor_parallel {tp} does not divide the model's {model.num_kv_heads} key/value "
                                    "heads (grouped-query attention)", f"use a divisor of {model.num_kv_heads}")
    if gpus_per_node is not None and (tp > gpus_per_node or gpus_per_node % tp):
        return ParallelRefusal(key, f"tensor_parallel {tp} does not fit inside a node of {gpus_per_node} GPU(s): its "
                                    "all-reduces run twice per layer and need NVLink",
                               f"use a divisor of {gpus_per_node}")
    return None


def combination_refusal(tp: int, cp: int, *, stage: str, adapter: str) -> ParallelRefusal | None:
    """What the runtime paths cannot combine, or None."""
    if tp <= 1 and cp <= 1:
        return None
    key = "distributed.tensor_parallel" if tp > 1 else "distributed.context_parallel"
    if tp > 1 and cp > 1:
        return ParallelRefusal(key, "tensor and context parallel together are not supported: transformers shards "
                                    "the tensor-parallel model at load on a (replicate, shard, tp) mesh without a "
                                    "context dimension, while context parallel needs Accelerate's own FSDP2 mesh",
                               "set one of them to 1")
    if not stage_spec(stage).model_parallel:
        return ParallelRefusal(key, f"{key.split('.')[1]} runs in the {' and '.join(stages_with('model_parallel'))} "
                                    f"stages (the transformers Trainer's step), not {stage}", "set it to 1")
    if tp > 1 and adapter != "none":
        return ParallelRefusal(key, "tensor parallel trains full weights: transformers shards the base linears as "
                                    "DTensors at load, and peft's LoRA layers beside them are not sharded",
                               "use adapter.type: none, or tensor_parallel: 1")
    return None


@dataclass(frozen=True)
class Split:
    """One way to lay the GPUs out: replicate x shard x tp x cp = GPUs."""

    tensor_parallel: int
    context_parallel: int
    dp_replicate: int
    dp_shard: int

    @property
    def data_parallel(self) -> int:
        """Ranks that see distinct batches."""
        return self.dp_replicate * self.dp_shard


def splits(model: ModelSpec, hw: Hardware, dist: DistributedConfig, *, seq_len: int, stage: str, adapter: str,
           attention: str, packing: bool) -> tuple[list[Split], list[ParallelRefusal]]:
    """FSDP2 splits with tensor or context parallel above 1 for `hw` (smallest TP x CP first), and the
    refusals of pinned sizes. `dist` is the recipe's `distributed:` section; `auto` sizes are searched,
    pinned ones used as given."""
    g, per_node = hw.num_gpus, hw.gpus_per_node
    pins = {k: dist.pinned_size(k) for k in ("tensor_parallel", "context_parallel",
                                             "data_parallel_replicate", "data_parallel_shard")}
    refused: list[ParallelRefusal] = []
    tps = [pins["tensor_parallel"]] if pins["tensor_parallel"] else [t for t in SIZES if t <= per_node]
    cps = [pins["context_parallel"]] if pins["context_parallel"] else [c for c in SIZES if c <= MAX_CONTEXT_PARALLEL]
    out: list[Split] = []
    for tp in tps:
        why = tensor_parallel_refusal(model, tp, gpus_per_node=per_node)
        if why:
            if pins["tensor_parallel"]:
                refused.append(why)
            continue
        for cp in cps:
            if tp * cp == 1:
                continue
            why = (context_parallel_refusal(cp, seq_len=seq_len, model_type=model.model_type, attention=attention,
                                            packing=packing)
                   or combination_refusal(tp, cp, stage=stage, adapter=adapter))
            if why:
                pinned_here = (pins["context_parallel"] and cp > 1) or (pins["tensor_parallel"] and tp > 1)
                if pinned_here:
                    refused.append(why)
                continue
            if g % (tp * cp):
                if pins["tensor_parallel"] or pins["context_parallel"]:
                    refused.append(ParallelRefusal(
                        "distributed.tensor_parallel" if tp > 1 else "distributed.context_parallel",
                        f"tensor_parallel {tp} x context_parallel {cp} = {tp * cp} does not divide the "
                        f"{g} GPU(s) of {hw.describe()}", f"use sizes whose product divides {g}"))
                continue
            ranks = g // (tp * cp)
            replicate = pins["data_parallel_replicate"] or (
                hw.nodes if dist.fsdp_sharding == "hybrid_shard" and ranks % hw.nodes == 0 else 1)
            if ranks % replicate:
                refused.append(ParallelRefusal("distributed.data_parallel_replicate",
                                               f"data_parallel_replicate {replicate} does not divide the {ranks} "
                                               f"rank(s) left by tensor {tp} x context {cp} parallel",
                                               f"use a divisor of {ranks}"))
                continue
            shard = ranks // replicate
            if pins["data_parallel_shard"] and pins["data_parallel_shard"] != shard:
                refused.append(ParallelRefusal("distributed.data_parallel_shard",
                                               f"data_parallel_shard {pins['data_parallel_shard']} x replicate "
                                               f"{replicate} x tensor {tp} x context {cp} is not the {g} GPU(s) "
                                               f"of {hw.describe()}", f"use {shard}, or auto"))
                continue
            out.append(Split(tp, cp, replicate, shard))
    out.sort(key=lambda s: (s.tensor_parallel * s.context_parallel, s.tensor_parallel))
    return out, refused


# ----------------------------------------------------------------------------- for the planner

def runs_device_mesh(caps: BackendCapabilities) -> bool:
    """Whether the backend of capability record `caps` runs transformers' tensor-parallel plans and
    context parallel on a device mesh of replicate x shard x context x tensor ranks (FSDP2 through
    Accelerate's ParallelismConfig)."""
    return "data_parallel_shard" in caps.parallel_sizes


def check_pinned_sizes(w: Workload, hw: Hardware, dist: DistributedConfig, planners: Planners) -> None:
    """Raise the first refusal of the parallel sizes the recipe pins, located at its key (GPU targets:
    the sizes are checked against the model, the sequence and the GPU count). `planners`: the backends
    planned with (`plan.planners.Planners`)."""
    from recipeforge.errors import RecipeError

    if hw.device != "cuda":
        return
    pinned = [k for k in ("tensor_parallel", "context_parallel", "data_parallel_replicate", "data_parallel_shard")
              if (size := dist.pinned_size(k)) is not None and size > 1]
    if not pinned or (dist.backend != "auto" and not runs_device_mesh(planners.capabilities(dist.backend))):
        return  # a backend with model parallelism of its own checks its own sizes
    found, refused = splits(w.model, hw, dist, seq_len=w.seq_len, stage=w.stage, adapter=w.adapter,
                            attention=w.attn_implementation, packing=w.packing)
    # backend auto with only a tensor-parallel size pinned: a backend with tensor parallel of its own
    # (Megatron) may still take it for pretraining
    own_tp = dist.backend == "auto" and pinned == ["tensor_parallel"] and w.stage == Stage.PRETRAIN and any(
        "tensor_parallel" in c.parallel_sizes and w.stage in c.stages
        for c in planners.all_capabilities().values() if not runs_device_mesh(c))
    if refused and not found and not own_tp:
        r = refused[0]
        raise RecipeError(r.message, key=r.key, hint=r.hint or None)


def parallel_reasons(layout: Layout, dist: DistributedConfig, w: Workload, memory_gb_activations: float,
                     terms: str) -> dict[str, Choice]:
    """The plan's reasons for the device mesh's tensor / context / replicate / shard sizes (FSDP2) and
    the activations."""
    from recipeforge.plan.types import Choice

    out: dict[str, Choice] = {}
    if runs_device_mesh(layout.capabilities):
        def why(key: str, auto: str) -> str:
            return "recipe pins it" if dist.pinned_size(key) is not None else auto

        model = w.model
        out["tensor_parallel"] = Choice(layout.tensor_parallel, why(
            "tensor_parallel", f"auto: splits {model.num_heads} heads / {model.num_kv_heads} KV heads "
                               f"{layout.tensor_parallel} ways inside a node (the model's tensor-parallel plan)"
            if layout.tensor_parallel > 1 else "auto: not needed, the layout without it comes first"))
        out["context_parallel"] = Choice(layout.context_parallel, why(
            "context_parallel", f"auto: {w.seq_len} tokens per sequence split {layout.context_parallel} ways "
                                f"(ring attention), {w.seq_len // layout.context_parallel} per GPU"
            if layout.context_parallel > 1 else "auto: not needed, the layout without it comes first"))
        shard = layout.data_parallel // max(1, layout.dp_replicate)
        out["dp_replicate"] = Choice(layout.dp_replicate, why(
            "data_parallel_replicate", "auto: one replica per node (hybrid sharding)" if layout.dp_replicate > 1
            else "auto: one replica, sharded over every data-parallel rank"))
        out["dp_shard"] = Choice(shard, why(
            "data_parallel_shard", f"auto: GPUs / (replicas {layout.dp_replicate} x tensor {layout.tensor_parallel} "
                                   f"x context {layout.context_parallel})"))
    out["activations"] = Choice(round(memory_gb_activations, 2), terms)
    return out
