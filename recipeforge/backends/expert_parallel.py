"""Expert parallel at training time, on the fsdp backend: transformers' own expert-parallel plan.

A plan with `distributed.expert_parallel` N > 1 (`plan.experts`) loads the model sharded by
``from_pretrained(distributed_config=DistributedConfig(ep_size=N, fsdp_size=D))``: each MoE layer's
fused expert weights are split on the expert dimension over the N ranks of an expert group (a DTensor
``Shard(0)`` on the ``ep`` mesh, `transformers.distributed.expert_parallel.MoEParamShard`), the
experts' forward is replaced by the all-to-all token dispatch (`AllToAllEP`: each (token, expert)
pair goes to the expert's rank and its output comes back), and FSDP2 shards the rest of the model over
the D data-parallel ranks (transformers' ``fsdp_plan``). The Trainer takes such a model as "sharded at
load" and neither wraps nor shards it again. This is the engine the planner sizes, and it runs on gloo
as on NCCL: the exchange is ``all_to_all_single``, which gloo implements on the CPU.

What transformers leaves to the caller, done here:

- **Checkpoints.** The Trainer refuses to checkpoint the optimizer of a model sharded at load
  (``save_only_model``). `attach` adds the missing part to each checkpoint the Trainer writes: the
  sharded model and optimizer state through torch's distributed checkpoint (DCP, one file per rank,
  ``expert_parallel/``), the scheduler, every rank's RNG state, and ``expert_parallel.json`` with the
  size it was saved at; and resumes from them. A checkpoint resumes at the size it was saved with
  (`check_resume` refuses another, naming it).
- **What each rank holds**, read from the loaded model (`held`), written per rank to
  ``expert_parallel/rank<N>.json`` in the run directory and summarized in backend.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, Trainer

    from recipeforge.plan.types import Plan
    from recipeforge.stages.context import StageContext, WorkerHooks

KEY = "distributed.expert_parallel"
LAYOUT_FILE = "expert_parallel.json"   # in a checkpoint: the size it was saved with
STATE_DIR = "expert_parallel"           # in a checkpoint: DCP shards of model and optimizer; in a run: rank reports
SCHEDULER_FILE = "scheduler.pt"


def size(plan: Plan) -> int:
    """The plan's expert-parallel size (1: every rank holds every expert)."""
    chosen = plan.reasons.get("expert_parallel")
    return int(chosen.value) if chosen is not None else 1


def distributed_config_kwargs(plan: Plan) -> dict[str, int]:
    """Keyword arguments of transformers' ``DistributedConfig`` for an expert-parallel plan: experts over
    ``ep_size`` ranks, FSDP2 over the data-parallel ranks of a replica (the experts' replicas, ``fsdp_size``
    / ``ep_size`` of them, shard each rank's experts further)."""
    part = plan.backend_part  # FSDP2's mesh (`backends.fsdp_plan.FSDPPart`): replicas x ranks each shards over
    replicate = max(1, int(getattr(part, "dp_replicate", 1)))
    shard = int(getattr(part, "dp_shard", 0))
    shard = shard if shard > 1 else plan.data_parallel // replicate
    return {"ep_size": size(plan), "fsdp_size": shard, "dp_replicate_size": replicate}


def load(path: str, plan: Plan, *, dtype: torch.dtype, attn_implementation: str, revision: str | None = None,
         trust_remote_code: bool = False) -> Any:
    """The model at `path` loaded with its experts split over the plan's expert-parallel ranks and FSDP2
    over the rest. Every process of the job calls this (the device mesh is built collectively)."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation,
                                                revision=revision, trust_remote_code=trust_remote_code,
                                                distributed_config=DistributedConfig(**distributed_config_kwargs(plan)))


def worker_hooks(ctx: StageContext) -> WorkerHooks:
    """The fsdp backend's worker hooks for an expert-parallel plan: the model loaded by `load` (a
    random-init base is written to base_model/ first, then read), and once the trainer exists, this
    rank's report (`write_rank_report`, kept for backend.json) and the checkpoint hooks (`attach`)."""
    from recipeforge.stages.context import WorkerHooks

    plan = ctx.plan

    def load_sharded(path: str, *, dtype: torch.dtype, attn_implementation: str,
                     revision: str | None = None, trust_remote_code: bool = False) -> Any:
        return load(path, plan, dtype=dtype, attn_implementation=attn_implementation, revision=revision,
                    trust_remote_code=trust_remote_code)

    def prepare(trainer: Trainer) -> None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        trainer.rf_expert_parallel = write_rank_report(ctx, model)
        attach(trainer, ctx)

    return WorkerHooks(load_sharded=load_sharded, prepare_trainer=prepare)


def held(model: PreTrainedModel) -> dict[str, Any]:
    """What this rank holds of each MoE layer, read from the model's parameters: the experts of each
    layer (the local rows of the fused expert weights), and the elements of expert and other parameters
    held here against their full sizes."""
    from torch.distributed.tensor import DTensor

    from recipeforge.components.moe import base_experts, moe_layers

    layers = []
    expert_ids: set[int] = set()
    expert_local = expert_full = 0
    for layer in moe_layers(model):
        experts = base_experts(layer.experts)
        weights = [p for p in experts.parameters(recurse=False) if p.dim() == 3]
        local = [p.to_local() if isinstance(p, DTensor) else p for p in weights]
        layers.append({"layer": layer.name, "experts": int(local[0].shape[0]), "of": int(weights[0].shape[0])})
        for p, mine in zip(weights, local):
            expert_ids.add(id(p))
            expert_local += mine.numel()
            expert_full += p.numel()
    other_local = other_full = 0
    for p in model.parameters():
        if id(p) in expert_ids:
            continue
        other_local += (p.to_local() if isinstance(p, DTensor) else p).numel()
        other_full += p.numel()
    return {"layers": layers, "expert_elements": expert_local, "expert_elements_full": expert_full,
            "other_elements": other_local, "other_elements_full": other_full}


def write_rank_report(ctx: StageContext, model: PreTrainedModel) -> dict[str, Any]:
    """`held` of this rank, written to ``expert_parallel/rank<N>.json`` in the run directory (every rank
    writes its own: nothing is gathered) and returned."""
    import torch.distributed as dist

    report = {"rank": ctx.dist.rank, "world_size": ctx.dist.world_size, "expert_parallel": size(ctx.plan),
              "process_group_backend": dist.get_backend() if dist.is_initialized() else None, **held(model)}
    folder = ctx.run.root / STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".rank{ctx.dist.rank}.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, folder / f"rank{ctx.dist.rank}.json")
    return report


def original_format(model: PreTrainedModel) -> None:
    """Let `save_pretrained` write the model's own checkpoint layout (per-expert weights for Qwen3-MoE
    and Mixtral, as one process writes them and vLLM reads them). A model loaded from fused expert
    weights (a random-init base written by the run) carries an empty list of the conversions it went
    through, with which transformers writes the fused layout back; without it, transformers uses the
    model type's default mapping."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
    if vars(base).get("_weight_conversions") == []:
        del base._weight_conversions


def saved_size(checkpoint: Path) -> int:
    """The expert-parallel size a checkpoint was saved with (1 for one written without expert parallel)."""
    layout = checkpoint / LAYOUT_FILE
    if not layout.is_file():
        return 1
    return int(json.loads(layout.read_text())["expert_parallel"])


def check_resume(plan: Plan, checkpoint: Path | None) -> None:
    """Refuse to resume `checkpoint` at an expert-parallel size other than the one it was saved with: its
    optimizer state is sharded by expert (DCP) under expert parallel and whole otherwise."""
    if checkpoint is None:
        return
    saved, now = saved_size(checkpoint), size(plan)
    if saved == now:
        return
    launch = f" on {saved} processes (--nproc-per-node {saved})" if saved > 1 else " on one process"
    raise RecipeError(f"{checkpoint.name} was saved with expert parallel {saved}, and this run plans expert "
                      f"parallel {now}: its optimizer state is split as it was saved", key=KEY,
                      hint=f"resume with distributed.expert_parallel: {saved}{launch}, or start over "
                           "(output.resume: never)")


def attach(trainer: Trainer, ctx: StageContext) -> None:
    """Make `trainer` checkpoint and resume an expert-parallel model whole: the Trainer saves such a
    model's weights only (``save_only_model``); every checkpoint also gets the DCP shards of model and
    optimizer, the scheduler and the RNG states, and a resume reads them back (model before training,
    optimizer and scheduler once the Trainer has built them)."""
    save_model = trainer.save_model

    def save_with_state(output_dir: str | None = None, _internal_call: bool = False) -> None:
        save_model(output_dir, _internal_call=_internal_call)
        if _internal_call and output_dir is not None:  # a checkpoint (final/ is `save_final`'s)
            save_state(trainer, Path(output_dir), size(ctx.plan))

    def load_model(checkpoint: str, model: PreTrainedModel | None = None) -> None:
        load_state(trainer, Path(checkpoint), optimizer=False)

    def load_optimizer(checkpoint: str | None) -> None:
        if checkpoint is not None:
            load_state(trainer, Path(checkpoint), optimizer=True)

    trainer.save_model = save_with_state
    trainer._load_from_checkpoint = load_model
    trainer._load_optimizer_and_scheduler = load_optimizer


def _states(trainer: Trainer, optimizer: bool) -> tuple[Any, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model = trainer.accelerator.unwrap_model(trainer.model)
    if optimizer:
        return get_state_dict(model, _torch_optimizer(trainer))
    return get_model_state_dict(model), None


def _torch_optimizer(trainer: Trainer) -> Any:
    """The torch optimizer under Accelerate's wrapper (DCP reads and sets its state)."""
    return getattr(trainer.optimizer, "optimizer", trainer.optimizer)


def save_state(trainer: Trainer, folder: Path, ep: int) -> None:
    """Write the sharded model and optimizer state (DCP), the scheduler and this rank's RNG state into
    the checkpoint `folder`. Collective: every rank writes its own shards."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    model_state, optim_state = _states(trainer, optimizer=trainer.optimizer is not None)
    state = {"model": model_state} if optim_state is None else {"model": model_state, "optimizer": optim_state}
    dcp_save(state, checkpoint_id=str(folder / STATE_DIR))
    trainer._save_rng_state(str(folder))
    if trainer.args.should_save:
        if trainer.lr_scheduler is not None:
            torch.save(trainer.lr_scheduler.state_dict(), folder / SCHEDULER_FILE)
        (folder / LAYOUT_FILE).write_text(json.dumps({"expert_parallel": ep}) + "\n")


def load_state(trainer: Trainer, folder: Path, *, optimizer: bool) -> None:
    """Read the DCP shards of a checkpoint back into the sharded model (and, with `optimizer`, into the
    optimizer and scheduler the Trainer has built). Collective."""
    import torch
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    if not (folder / STATE_DIR).is_dir():
        raise RecipeError(f"{folder} holds no expert-parallel state ({STATE_DIR}/)", key=KEY,
                          hint="resume it with distributed.expert_parallel: 1 on one process, or start over "
                               "(output.resume: never)")
    model = trainer.accelerator.unwrap_model(trainer.model)
    model_state, optim_state = _states(trainer, optimizer=optimizer)
    state = {"model": model_state} if optim_state is None else {"model": model_state, "optimizer": optim_state}
    dcp_load(state, checkpoint_id=str(folder / STATE_DIR))
    if optim_state is None:
        set_model_state_dict(model, state["model"])
        return
    set_state_dict(model, _torch_optimizer(trainer), model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler = folder / SCHEDULER_FILE
    if trainer.lr_scheduler is not None and scheduler.is_file():
        trainer.lr_scheduler.load_state_dict(torch.load(scheduler, weights_only=True))
