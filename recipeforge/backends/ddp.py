"""DistributedDataParallel through Accelerate: a full replica per process, one gradient all-reduce.

On GPUs the processes use NCCL. On the CPU they use gloo: the accelerate config says MULTI_GPU (that
only tells `accelerate launch` to start one process per rank through torch's elastic launcher;
``--cpu`` with several processes would start a single one), and inside each worker Accelerate finds
no GPU and runs MULTI_CPU over gloo.
"""

from __future__ import annotations

from recipeforge.backends.base import TrainerBackend


class DDPBackend(TrainerBackend):
    """Data parallel replicas (torch DDP)."""

    name = "ddp"

    def launcher(self, plan) -> str:
        # One process is plain single-device training; there is nothing to launch.
        return "accelerate" if plan.world_size > 1 else "none"

    def trainer_kwargs(self, ctx) -> dict:
        return {"ddp_backend": "gloo"} if ctx.plan.device != "cuda" else {}

    def runtime_report(self, trainer) -> dict:
        report = super().runtime_report(trainer)
        report["ddp"] = type(trainer.model_wrapped).__name__ == "DistributedDataParallel"
        return report
