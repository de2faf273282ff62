"""Backend configurations generated from a plan, as plain data (what the built-in backends launch with).

- `deepspeed_config`: a DeepSpeed JSON config (ZeRO stage, offload, precision, batch sizes).
- `fsdp_plugin_config`: keyword arguments of Accelerate's ``FullyShardedDataParallelPlugin`` for FSDP2.
- `megatron_parallel_settings`: Megatron-Bridge ``ConfigContainer`` fields, grouped by section.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

from recipeforge.errors import RecipeError
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    from recipeforge.config.schema import Recipe


# The backends' parts of a plan as read here: `deepspeed.ZeroPart` and `fsdp.FSDPPart`, which this module
# cannot name (those modules import it). `_require` has checked the plan's backend first, and a plan's
# part is the one its backend's spec reads and writes (`PlannerSpec.plan_part_type`).
class _ZeroPart(Protocol):
    zero_stage: int


class _FSDPPart(Protocol):
    sharding: str


def _hidden(plan: Plan) -> int:
    return int(plan.extra.model.get("hidden_size", 4096))


def _dtype(plan: Plan) -> str:
    return plan.extra.dtype


def _require(plan: Plan, backend: str) -> None:
    if plan.backend != backend:
        raise RecipeError(f"the plan uses backend {plan.backend}, not {backend}",
                          hint=f"set distributed.backend: {backend} to plan for it")


def deepspeed_config(plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """A DeepSpeed config for `plan`. Batch sizes are explicit and consistent:
    train_batch_size = micro * accumulation * data-parallel ranks."""
    _require(plan, "deepspeed")
    h = _hidden(plan)
    stage = cast(_ZeroPart, plan.backend_part).zero_stage
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                  # bucket sizes scale with the model (as the HF integration's "auto" does), so small
                  # models do not allocate DeepSpeed's 500M-element defaults
                  "reduce_bucket_size": h * h}
    if stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=h * h, reduce_scatter=True)
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=int(0.9 * h * h), stage3_param_persistence_threshold=10 * h,
                    stage3_gather_16bit_weights_on_model_save=True)
    if plan.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    # The trainer's own mixed-precision switches are on only on GPUs (`stages.trainer_args`), and
    # transformers refuses a DeepSpeed config that disagrees with them.
    dtype = _dtype(plan) if plan.device == "cuda" else "fp32"
    t = recipe.train
    clip = t.max_grad_norm
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation,
        "gradient_clipping": clip if clip is not None else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16", "loss_scale": 0, "initial_scale_power": 16,
                 "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "steps_per_print": recipe.train.logging_steps,
        "wall_clock_breakdown": False,
    }
    if plan.offload != "none":
        # Offloaded optimizer states are stepped by DeepSpeed's CPU Adam, which DeepSpeed builds only from
        # its own optimizer section (a trainer-made torch optimizer is refused with offload). The values
        # equal the trainer's, which checks them; the learning-rate schedule stays the trainer's.
        config["optimizer"] = {"type": "AdamW", "params": {
            "lr": t.learning_rate, "betas": [t.adam_beta1, t.adam_beta2], "eps": 1e-8,
            "weight_decay": t.weight_decay}}
    elif t.optimizer not in ("adamw", "adamw_fused"):
        config["zero_allow_untested_optimizer"] = True  # ZeRO wraps any torch optimizer; it only warns
    return config


def fsdp_sharding(plan: Plan) -> str:
    """The FSDP sharding strategy the plan chose (full_shard | shard_grad_op | hybrid_shard)."""
    _require(plan, "fsdp")
    return cast(_FSDPPart, plan.backend_part).sharding


def fsdp_plugin_config(plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """Keyword arguments for ``accelerate.utils.FullyShardedDataParallelPlugin`` (FSDP2).

    Precision is not among them: Accelerate derives FSDP2's ``MixedPrecisionPolicy`` from its own
    mixed-precision setting (the launch config and the trainer's bf16/fp16 arguments), which the
    plan's dtype already sets."""
    sharding = fsdp_sharding(plan)
    layer_class = plan.extra.model.get("decoder_layer_class")
    config: dict[str, Any] = {
        "fsdp_version": 2,
        # FSDP2 expresses full_shard / shard_grad_op as resharding (or not) after forward; hybrid
        # sharding reshards too, inside each node (the backend adds the replicate/shard mesh)
        "reshard_after_forward": sharding != "shard_grad_op",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        # a vision tower's layers are units of their own too, as the planner shards them
        "transformer_cls_names_to_wrap": [c for c in (layer_class, plan.extra.model.get("vision_block_class")) if c]
        or None,
        # FSDP's own checkpointing is whole layers; selective or every-N-th checkpointing is the
        # runner's, inside each wrapped layer (`stages.checkpointing`)
        "activation_checkpointing": plan.gradient_checkpointing and plan.checkpoint_mode == "full"
        and plan.checkpoint_every == 1,
        "cpu_offload": plan.offload != "none",
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": True,
    }
    return config


def megatron_parallel_settings(plan: Plan, recipe: Recipe) -> dict[str, Any]:
    """Megatron-Bridge settings: model-parallel sizes on the model provider, batch sizes on the
    training config, the distributed optimizer (and its CPU offload) on the optimizer config."""
    _require(plan, "megatron")
    offload = plan.offload != "none"
    return {
        "model": {
            "tensor_model_parallel_size": plan.tensor_parallel,
            "pipeline_model_parallel_size": plan.pipeline_parallel,
            "context_parallel_size": 1,
            "sequence_parallel": plan.tensor_parallel > 1,
            **megatron_recompute(plan),
        },
        "train": {"micro_batch_size": plan.micro_batch_size, "global_batch_size": plan.global_batch_size},
        "optimizer": {
            "use_distributed_optimizer": True,
            "optimizer_cpu_offload": offload,
            "optimizer_offload_fraction": 1.0 if offload else 0.0,
            "use_precision_aware_optimizer": offload,
            "overlap_cpu_optimizer_d2h_h2d": offload,
            "clip_grad": recipe.train.max_grad_norm or 0.0,
        },
        "ddp": {"use_distributed_optimizer": True, "grad_reduce_in_fp32": True},
        "data_parallel_size": plan.data_parallel,
    }


def megatron_recompute(plan: Plan) -> dict[str, Any]:
    """Megatron's recomputation for the plan's checkpointing: every layer recomputed whole (`full`,
    `uniform`, one layer per chunk), only its attention and activation functions (`selective`, no
    method), or whole but only for some layers (`block`: the first ceil(layers / N) of each pipeline
    stage, as many as checkpointing every N-th layer covers)."""
    if not plan.gradient_checkpointing:
        return {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}
    if plan.checkpoint_mode == "selective":
        return {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None}
    if plan.checkpoint_every > 1:
        layers = int(plan.extra.model.get("layers") or 0) // max(1, plan.pipeline_parallel)
        return {"recompute_granularity": "full", "recompute_method": "block",
                "recompute_num_layers": max(1, -(-layers // plan.checkpoint_every))}
    return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
