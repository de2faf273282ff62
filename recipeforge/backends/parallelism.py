"""A plan's tensor / context / replicate / shard sizes as the settings of the libraries that run them.

Two runtime paths, both upstream's own (nothing here shards a tensor itself):

- **tensor parallel** (``plan.tensor_parallel > 1``): transformers loads the model sharded with its
  tensor-parallel plan and FSDP2 on the other ranks (``DistributedConfig(tp_size, fsdp_size,
  dp_replicate_size)``); the Trainer then prepares it as a model "sharded at load" and hands
  Accelerate a ``ParallelismConfig(tp_size, dp_shard_size=data-parallel ranks)`` (the config it
  derives itself from the loaded model, given here explicitly so the launch file says the same).
  Accelerate runs it as MULTI_GPU, not with its FSDP plugin (which would shard a second time).
- **context parallel** (``extra.context_parallel > 1``): Accelerate's FSDP2 plugin with a
  ``ParallelismConfig(dp_replicate_size, dp_shard_size, cp_size, cp_backend="torch")``; the Trainer
  splits each batch's sequences (``maybe_context_parallel``) and PyTorch's ring attention runs sdpa.

Accelerate refuses a ``ParallelismConfig`` on a MULTI_CPU state; the fsdp backend's CPU workers name
their state MULTI_GPU (`backends.fsdp_run.configure_cpu_state`), so tensor parallel trains through the
Trainer on the CPU over gloo too. Context parallel needs CUDA (ring attention). Field names were read
from accelerate 1.15 and 1.12 (``ParallelismConfig``, the config file's ``parallelism_config_*`` keys)
and transformers 5.23 (``DistributedConfig``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    import torch

    from recipeforge.plan.types import Plan
    from recipeforge.stages.context import StageContext, WorkerHooks


@runtime_checkable
class MeshPart(Protocol):
    """A backend's part of a plan that carries a device mesh of its own (FSDP2's `fsdp.FSDPPart`):
    replicas, and the GPUs each replica shards over."""

    dp_replicate: int
    dp_shard: int


def sizes(plan: Plan) -> dict[str, int]:
    """The plan's mesh: replicate x shard x tensor x context = world size (FSDP plans; 1s otherwise)."""
    part = plan.backend_part
    if not isinstance(part, MeshPart):  # a backend without a device mesh of its own
        return {"dp_replicate": 1, "dp_shard": plan.data_parallel, "tp": 1, "cp": 1}
    replicate = max(1, part.dp_replicate)
    shard = part.dp_shard if part.dp_shard > 1 else plan.data_parallel // replicate
    return {"dp_replicate": replicate, "dp_shard": shard, "tp": plan.tensor_parallel, "cp": plan.extra.context_parallel}


def tensor_parallel(plan: Plan) -> bool:
    """Whether the model is loaded sharded with its tensor-parallel plan."""
    return isinstance(plan.backend_part, MeshPart) and plan.tensor_parallel > 1


def expert_parallel(plan: Plan) -> bool:
    """Whether the model is loaded with its experts split over ranks (`backends.expert_parallel`)."""
    chosen = plan.reasons.get("expert_parallel")
    return isinstance(plan.backend_part, MeshPart) and chosen is not None and int(chosen.value) > 1


def expert_parallel_hooks(ctx: StageContext) -> WorkerHooks:
    """Worker hooks of an expert-parallel plan (`backends.expert_parallel.worker_hooks`)."""
    from recipeforge.backends.expert_parallel import worker_hooks

    return worker_hooks(ctx)


def original_format(model: PreTrainedModel) -> None:
    """`backends.expert_parallel.original_format`: final/ in the model's own checkpoint layout."""
    from recipeforge.backends.expert_parallel import original_format as keep_layout

    keep_layout(model)


def context_parallel(plan: Plan) -> bool:
    """Whether sequences are split over GPUs (ring attention)."""
    return isinstance(plan.backend_part, MeshPart) and plan.extra.context_parallel > 1


def parallelism_config_kwargs(plan: Plan) -> dict[str, Any] | None:
    """Keyword arguments of ``accelerate.ParallelismConfig`` for `plan`, or None when it needs none
    (plain FSDP2 within a replica)."""
    s = sizes(plan)
    if tensor_parallel(plan):
        # What the Trainer derives from a model sharded at load: every data-parallel rank as dp_shard
        # (transformers' own mesh keeps replicas apart inside the model).
        return {"dp_replicate_size": 1, "dp_shard_size": s["dp_replicate"] * s["dp_shard"], "tp_size": s["tp"]}
    if context_parallel(plan) or s["dp_replicate"] > 1:
        kwargs: dict[str, Any] = {"dp_replicate_size": s["dp_replicate"], "dp_shard_size": s["dp_shard"]}
        if context_parallel(plan):
            kwargs.update(cp_size=s["cp"], cp_backend="torch")
        return kwargs
    return None


def accelerate_parallelism_section(plan: Plan) -> dict[str, Any]:
    """The ``parallelism_config`` section of the accelerate config file (`accelerate launch` turns each
    ``parallelism_config_<field>`` into ``PARALLELISM_CONFIG_<FIELD>`` for the workers)."""
    kwargs = parallelism_config_kwargs(plan)
    if kwargs is None:
        return {}
    return {"parallelism_config": {f"parallelism_config_{k}": v for k, v in kwargs.items()}}


def distributed_config_kwargs(plan: Plan) -> dict[str, int] | None:
    """Keyword arguments of transformers' ``DistributedConfig`` that load the model tensor-parallel
    (with FSDP2 over the remaining ranks), or None without tensor parallelism."""
    if not tensor_parallel(plan):
        return None
    s = sizes(plan)
    return {"tp_size": s["tp"], "fsdp_size": s["dp_shard"], "dp_replicate_size": s["dp_replicate"]}


def parallelism_config(plan: Plan) -> Any:
    """The ``accelerate.ParallelismConfig`` of `plan` (None when it needs none)."""
    kwargs = parallelism_config_kwargs(plan)
    if kwargs is None:
        return None
    from accelerate import ParallelismConfig

    return ParallelismConfig(**kwargs)


def load_tensor_parallel(path: str, plan: Plan, *, dtype: torch.dtype, attn_implementation: str,
                         revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The model at `path` (a checkpoint directory or hub id) loaded sharded: transformers applies its
    tensor-parallel plan (DTensor weights on the ``tp`` mesh) and FSDP2 on the other ranks. Every
    process of the job calls this (the mesh is built collectively)."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    kwargs = distributed_config_kwargs(plan)
    if kwargs is None:
        raise ValueError("the plan has no tensor parallelism")
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation,
                                                revision=revision, trust_remote_code=trust_remote_code,
                                                distributed_config=DistributedConfig(**kwargs))


def describe(plan: Plan) -> str:
    """One line for launch files: the mesh and which library runs each dimension."""
    s = sizes(plan)
    line = (f"replicate {s['dp_replicate']} x shard {s['dp_shard']} x tensor {s['tp']} x context {s['cp']} "
            f"= {s['dp_replicate'] * s['dp_shard'] * s['tp'] * s['cp']} processes")
    if tensor_parallel(plan):
        line += "; tensor parallel: transformers DistributedConfig at load (tp_plan), FSDP2 on the other ranks"
    if context_parallel(plan):
        line += "; context parallel: accelerate ParallelismConfig(cp_size) on FSDP2, torch ring attention (sdpa)"
    return line
