"""DistributedDataParallel through Accelerate: a full replica per process, one gradient all-reduce.

On GPUs the processes use NCCL. On the CPU they use gloo: the accelerate config says MULTI_GPU (that
only tells `accelerate launch` to start one process per rank through torch's elastic launcher;
``--cpu`` with several processes would start a single one), and inside each worker Accelerate finds
no GPU and runs MULTI_CPU over gloo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec
from recipeforge.capabilities import BackendCapabilities
from recipeforge.plan.backend_spec import Candidate
from recipeforge.plan.memory import Layout, replica_states

if TYPE_CHECKING:
    from transformers import Trainer

    from recipeforge.config.schema import DistributedConfig
    from recipeforge.plan.hardware import Hardware
    from recipeforge.plan.types import Plan
    from recipeforge.plan.workload import Workload
    from recipeforge.stages.context import StageContext


class DDPBackend(BackendSpec):
    """Data parallel replicas (torch DDP)."""

    name = "ddp"
    capabilities = BackendCapabilities(
        name, "a full replica per process (torch DDP); NCCL on GPUs, gloo on the CPU",
        why={"offload": "every replica keeps its full optimizer on its device"})
    cpu_preference = 1  # replicas: what several CPU processes run unless a pin asks for more

    def candidates(self, w: Workload, hw: Hardware, dist: DistributedConfig | None, *,
                   pinned: bool) -> list[Candidate]:
        g = hw.num_gpus
        if g <= 1 and not pinned:
            return []
        return [Candidate(Layout(self.name, None, data_parallel=g, nodes=hw.nodes, gpus_per_node=hw.gpus_per_node),
                          1, "a full replica per GPU; one gradient all-reduce per step")]

    def model_states(self, w: Workload, layout: Layout, part: dict[str, float], trainable: float,
                     frozen_bytes: float) -> float:
        # DDP's gradient buckets are a second copy of the gradients
        return replica_states(w, layout, part, trainable, frozen_bytes, gradient_buckets=True)

    def launcher(self, plan: Plan) -> str:
        # One process is plain single-device training; there is nothing to launch.
        return "accelerate" if plan.world_size > 1 else "none"

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"ddp_backend": "gloo"} if ctx.plan.device != "cuda" else {}
        kwargs.update(unused_parameter_kwargs(ctx.plan))
        return kwargs

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        report = super().runtime_report(trainer)
        report["ddp"] = type(trainer.model_wrapped).__name__ == "DistributedDataParallel"
        return report


# Model types whose checkpoints carry a vision or audio tower that text batches never run: their
# trained parameters there get no gradient, which DDP only tolerates when it searches for them.
TOWER_MODEL_TYPES = frozenset({
    "gemma3", "gemma3n", "llama4", "llava", "llava_next", "mistral3", "mllama", "paligemma", "qwen2_vl",
    "qwen2_5_vl", "qwen3_vl", "idefics3", "smolvlm"})


def unused_parameter_kwargs(plan: Plan) -> dict[str, Any]:
    """`ddp_find_unused_parameters` for a plan. DDP's search for parameters without a gradient costs an
    extra traversal of the autograd graph every step; in a causal LM (full fine-tuning or LoRA) every
    trained parameter is used in every forward pass, so the search is off. Models with a tower a text
    batch never runs need it; non-reentrant checkpointing is then used, since reentrant checkpointing
    and the search together make DDP mark parameters ready twice."""
    model_type = (plan.extra.model or {}).get("model_type")
    if model_type not in TOWER_MODEL_TYPES:
        return {"ddp_find_unused_parameters": False}
    kwargs: dict[str, Any] = {"ddp_find_unused_parameters": True}
    if plan.gradient_checkpointing:
        from transformers import TrainingArguments  # transformers 5 renamed the switch and its kwargs

        name = ("activation_checkpointing_kwargs" if "activation_checkpointing_kwargs"
                in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing_kwargs")
        kwargs[name] = {"use_reentrant": False}
    return kwargs
