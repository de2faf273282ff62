"""`distributed.backend: zero_redundancy`: DDP whose optimizer states are sharded over the ranks.

torch's `ZeroRedundancyOptimizer` is ZeRO stage 1 without DeepSpeed: every rank keeps a full replica
of the weights and gradients (DDP all-reduces the gradients as usual), but only the optimizer states
of its share of the parameters; after its local step each rank broadcasts the parameters it owns.
AdamW's two fp32 states, the largest term of a full fine-tune under DDP, shrink to 1/N per rank at
the cost of one parameter broadcast per step. It runs wherever DDP does: NCCL on GPUs, gloo on the CPU.

Everything recipeforge needs to know about the backend is in `ZeroRedundancyBackend`, registered by
the entry point ``zero_redundancy`` of the group ``recipeforge.backends``:

* what it runs (`capabilities`), read by `recipeforge validate` and the planner;
* the layout it offers the planner on GPUs, between DDP and the sharding engines, and its memory
  terms (a DDP replica whose optimizer states divide by the data-parallel size);
* the launcher and worker setup of DDP, which it inherits;
* in each worker, the trainer's optimizer wrapped in `ZeroRedundancyOptimizer`, its state
  consolidated on rank 0 for every checkpoint (resume loads it back into shards), and what really
  ran in backend.json.
"""

from __future__ import annotations

from dataclasses import replace

from recipeforge.backends.ddp import DDPBackend
from recipeforge.capabilities import BackendCapabilities
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.memory import Layout, replica_states
from recipeforge.stages.context import WorkerHooks

__all__ = ["ZeroRedundancyBackend", "install_zero_redundancy"]
__version__ = "0.1.0"

NAME = "zero_redundancy"


class ZeroRedundancyBackend(DDPBackend):
    """DDP replicas with optimizer states sharded by torch's `ZeroRedundancyOptimizer` (ZeRO-1)."""

    name = NAME
    capabilities = BackendCapabilities(
        NAME, "DDP with optimizer states sharded over the ranks by torch's ZeroRedundancyOptimizer (ZeRO-1 "
              "without DeepSpeed); NCCL on GPUs, gloo on the CPU",
        why={"offload": "ZeroRedundancyOptimizer keeps each rank's share of the optimizer states on its device"})
    # Only when the recipe names it on the CPU, where memory is not what a run is short of.
    cpu_preference = None

    # -- planning ---------------------------------------------------------------------------------
    def candidates(self, w, hw, dist, *, pinned: bool) -> list[Candidate]:
        """One layout on several GPUs: after DDP (it adds a broadcast per step), before the engines
        that shard gradients or weights (they add more traffic and an extra package or wrapper)."""
        g = hw.num_gpus
        if g <= 1 and not pinned:
            return []
        layout = Layout(NAME, None, data_parallel=g, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node)
        return [Candidate(layout, 1, "a full replica per GPU with optimizer states sharded over the ranks "
                                     "(torch ZeroRedundancyOptimizer): DDP's all-reduce plus one parameter "
                                     "broadcast per step", within=0.5)]

    def model_states(self, w, layout, part, trainable, frozen_bytes) -> float:
        # DDP's weights, gradients and gradient buckets; optimizer states over the data-parallel ranks
        return replica_states(w, layout, part, trainable, frozen_bytes, gradient_buckets=True,
                              optimizer_shards=layout.data_parallel)

    # -- inside each worker -----------------------------------------------------------------------
    def setup_worker(self, ctx) -> WorkerHooks:
        """Once the trainer exists, its optimizer is created sharded (`install_zero_redundancy`)."""
        return replace(super().setup_worker(ctx), prepare_trainer=install_zero_redundancy)

    def runtime_report(self, trainer) -> dict:
        report = super().runtime_report(trainer)
        from recipeforge_zero_redundancy.optimizer import is_sharded

        optimizer = _unwrapped(trainer.optimizer)
        report["optimizer"] = "ZeroRedundancyOptimizer" if is_sharded(optimizer) else type(optimizer).__name__
        if is_sharded(optimizer):
            local = optimizer.optim  # this rank's optimizer over the parameters it owns
            report["inner_optimizer"] = type(local).__name__
            report["local_state_elements"] = sum(t.numel() for state in local.state.values()
                                                 for t in state.values() if hasattr(t, "numel") and t.dim() > 0)
            report["local_param_elements"] = sum(p.numel() for group in local.param_groups for p in group["params"])
            report["trained_param_elements"] = sum(p.numel() for group in optimizer.param_groups
                                                   for p in group["params"])
        return report


def install_zero_redundancy(trainer) -> None:
    """Make `trainer` build its optimizer as a `ZeroRedundancyOptimizer` over the optimizer class and
    parameter groups the recipe gives it, and consolidate the sharded state on rank 0 before every
    checkpoint (a collective: every rank calls the trainer's save). Resuming loads the consolidated
    state back into each rank's shard (`ZeroRedundancyOptimizer.load_state_dict`)."""
    create, save = trainer.create_optimizer, getattr(trainer, "_save_optimizer_and_scheduler", None)
    if save is None:
        raise RuntimeError("this transformers Trainer has no _save_optimizer_and_scheduler: the zero_redundancy "
                           "backend cannot consolidate its optimizer state for checkpoints")

    from recipeforge_zero_redundancy.optimizer import is_sharded, sharded

    def create_optimizer(model=None):
        inner = create(model) if model is not None else create()
        if is_sharded(inner):
            return inner
        trainer.optimizer = sharded(inner)
        return trainer.optimizer

    def save_optimizer_and_scheduler(output_dir: str) -> None:
        optimizer = _unwrapped(trainer.optimizer)
        if is_sharded(optimizer):
            optimizer.consolidate_state_dict(to=0)  # the trainer writes optimizer.pt on rank 0
        save(output_dir)

    trainer.create_optimizer = create_optimizer
    trainer._save_optimizer_and_scheduler = save_optimizer_and_scheduler


def _unwrapped(optimizer):
    """The optimizer inside Accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)
