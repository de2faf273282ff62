"""FSDP2 through Accelerate's FSDP plugin: full / hybrid sharding, auto-wrap by decoder layer,
activation checkpointing, CPU offload; sharded checkpoints, consolidated final/. With tensor or
context parallel in the plan, the mesh is accelerate's ParallelismConfig (`backends.parallelism`).

GPUs (NCCL) and the CPU (gloo) take the same path. Accelerate turns its state into FSDP only from a
GPU-kind distributed type (MULTI_GPU, ...); a CPU worker's state is MULTI_CPU, with which the trainer
would silently run plain DDP with every parameter whole. So on the CPU the worker builds the process
state first and names it MULTI_GPU (`setup_worker`): Accelerate then sets up FSDP2 from it exactly as
on GPUs (`fully_shard` over a gloo device mesh, sharded DCP checkpoints, the full state dict gathered
for final/), and the trainer is told to use that configured state. backend.json records the DTensor
placements the run really had.
"""

from __future__ import annotations

from pathlib import Path

from recipeforge.backends.base import TrainerBackend, _common_report, full_state_dict_save


class FSDPBackend(TrainerBackend):
    """Fully sharded data parallel (FSDP2, ``fully_shard``) via Accelerate."""

    name = "fsdp"

    def launcher(self, plan) -> str:
        # Even one process: FSDP2 needs a launched worker and its process group (one GPU with CPU
        # offload is an FSDP job of one rank; in-process training would drop the plugin).
        return "accelerate"

    def plugin(self, plan, recipe) -> dict:
        """Keyword arguments of Accelerate's ``FullyShardedDataParallelPlugin`` (the planner's)."""
        from recipeforge.plan.artifacts import fsdp_plugin_config

        return fsdp_plugin_config(plan, recipe)

    def _hybrid(self, plan) -> bool:
        from recipeforge.plan.artifacts import fsdp_sharding

        return fsdp_sharding(plan) == "hybrid_shard"

    def accelerate_config(self, plan, recipe, run_dir: Path) -> dict:
        from recipeforge.backends import parallelism

        if parallelism.tensor_parallel(plan):
            # transformers shards the model at load (tensor plan + FSDP2); Accelerate's FSDP plugin
            # would shard it again, so the job runs as MULTI_GPU with the matching ParallelismConfig.
            return {"distributed_type": "MULTI_GPU", **parallelism.accelerate_parallelism_section(plan)}
        p = self.plugin(plan, recipe)
        fsdp = {"fsdp_version": 2,
                "fsdp_auto_wrap_policy": p["auto_wrap_policy"],
                "fsdp_reshard_after_forward": p["reshard_after_forward"],
                "fsdp_offload_params": p["cpu_offload"],
                "fsdp_state_dict_type": p["state_dict_type"],
                "fsdp_cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                "fsdp_activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(p["transformer_cls_names_to_wrap"])
        out = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        if self._hybrid(plan) and plan.extra.dp_replicate <= 1:  # a plan without the mesh sizes
            out["parallelism_config"] = {"parallelism_config_dp_replicate_size": plan.nodes,
                                         "parallelism_config_dp_shard_size": plan.gpus_per_node}
        else:
            out.update(parallelism.accelerate_parallelism_section(plan))
        return out

    def setup_worker(self, ctx) -> None:
        """On the CPU, the process state Accelerate turns into FSDP (see the module); with tensor
        parallelism, the stage loads the model sharded (`parallelism.load_tensor_parallel`); a 4-bit
        QLoRA base is loaded shard by shard (`quantized_loading`)."""
        from recipeforge.backends import parallelism

        if ctx.plan.device != "cuda":
            configure_cpu_state()

        if parallelism.tensor_parallel(ctx.plan):
            plan = ctx.plan

            def load_sharded(path, *, dtype, attn_implementation, revision=None, trust_remote_code=False):
                return parallelism.load_tensor_parallel(path, plan, dtype=dtype,
                                                        attn_implementation=attn_implementation,
                                                        revision=revision, trust_remote_code=trust_remote_code)

            ctx.load_sharded = load_sharded
        elif ctx.recipe.adapter.type == "qlora" and ctx.recipe.adapter.quant.bits == 4:
            # No process loads the whole 4-bit base: placeholders now, shards after `fully_shard`.
            from recipeforge.backends import quantized_loading

            record: dict = {}
            ctx.load_sharded = quantized_loading.loader(ctx, record)
            ctx.prepare_trainer = quantized_loading.shard_and_fill(ctx, record)

    def trainer_kwargs(self, ctx) -> dict:
        from transformers import TrainingArguments

        from recipeforge.backends import parallelism

        if parallelism.tensor_parallel(ctx.plan):
            # A model sharded at load: the Trainer prepares it without Accelerate's FSDP plugin, and
            # checkpoints its weights only (transformers cannot resume such a model's optimizer).
            return {"parallelism_config": parallelism.parallelism_config(ctx.plan), "save_only_model": True,
                    **_cpu_kwargs(ctx.plan)}
        p = self.plugin(ctx.plan, ctx.recipe)
        config = {"version": 2, "auto_wrap_policy": p["auto_wrap_policy"],
                  "reshard_after_forward": p["reshard_after_forward"], "cpu_offload": p["cpu_offload"],
                  "state_dict_type": p["state_dict_type"],
                  "cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                  "activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            config["transformer_layer_cls_to_wrap"] = p["transformer_cls_names_to_wrap"]
        # FSDP recomputes per wrapped layer itself; the trainer's own switch would add an all-gather.
        ckpt = ("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                else "gradient_checkpointing")
        kwargs = {"fsdp": True, "fsdp_config": config, ckpt: False, **_cpu_kwargs(ctx.plan)}
        if self._hybrid(ctx.plan) and ctx.plan.extra.dp_replicate <= 1:  # a plan without the mesh sizes
            from accelerate import ParallelismConfig

            kwargs["parallelism_config"] = ParallelismConfig(dp_replicate_size=ctx.plan.nodes,
                                                             dp_shard_size=ctx.plan.gpus_per_node)
        elif parallelism.parallelism_config_kwargs(ctx.plan) is not None:
            # context parallel (cp_size) and/or replicas: Accelerate builds the mesh, the Trainer splits sequences
            kwargs["parallelism_config"] = parallelism.parallelism_config(ctx.plan)
        return kwargs

    def save_final(self, ctx, trainer, model, tokenizer) -> Path | None:
        from recipeforge.backends import parallelism

        if parallelism.tensor_parallel(ctx.plan):
            # Collective: DTensor shards (tensor plan and FSDP2) gathered into full CPU tensors.
            return full_state_dict_save(ctx, model, tokenizer, gathered_state_dict(trainer.model))
        # Collective: the shards are all-gathered into a full CPU state dict on the main process.
        state_dict = trainer.accelerator.get_state_dict(trainer.model)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer) -> dict:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        report = _common_report(trainer)
        model = trainer.model
        params = list(model.parameters())
        report["fsdp_modules"] = sum(1 for m in model.modules() if isinstance(m, FSDPModule))
        report["dtensor_params"] = sum(1 for p in params if isinstance(p, DTensor))
        report["params"] = len(params)
        report["local_param_elements"] = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
                                             for p in params)
        report["full_param_elements"] = sum(p.numel() for p in params)
        # How the parameters really were split: DTensor placements by count, and the mesh they live on.
        dtensors = [p for p in params if isinstance(p, DTensor)]
        placements: dict[str, int] = {}
        for p in dtensors:
            key = ", ".join(str(pl) for pl in p.placements)
            placements[key] = placements.get(key, 0) + 1
        report["placements"] = dict(sorted(placements.items()))
        if dtensors:
            mesh = dtensors[0].device_mesh
            report["mesh"] = {"device_type": mesh.device_type, "shape": list(mesh.shape),
                              "dims": list(mesh.mesh_dim_names or ())}
        pc = getattr(trainer.accelerator, "parallelism_config", None)
        if pc is not None:  # the mesh Accelerate ran (tensor / context parallel, replicas)
            report["parallelism"] = {"dp_replicate": pc.dp_replicate_size, "dp_shard": pc.dp_shard_size,
                                     "tp": pc.tp_size, "cp": pc.cp_size}
        report["tp_size"] = getattr(model, "tp_size", None) or 1
        # QLoRA: bitsandbytes' 4-bit linears, whose packed weights (16-bit words) FSDP2 shards too
        quantized = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
        if quantized:
            report["quantized_modules"] = len(quantized)
            report["quantized_dtensor_weights"] = sum(1 for m in quantized if isinstance(m.weight, DTensor))
        return report


def configure_cpu_state() -> None:
    """The process state of a CPU worker, named MULTI_GPU so that Accelerate's state sets up FSDP2 from
    it as on GPUs; the device stays the CPU and the process group gloo (the trainer then uses this
    state: `_cpu_kwargs`)."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    state = PartialState(backend="gloo")
    if state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.NO):
        state.distributed_type = DistributedType.MULTI_GPU


def _cpu_kwargs(plan) -> dict:
    """Trainer arguments that keep the state `configure_cpu_state` made (use_cpu would rebuild it)."""
    if plan.device == "cuda":
        return {}
    return {"use_cpu": False, "accelerator_config": {"use_configured_state": True}}


def gathered_state_dict(model) -> dict:
    """The full state dict of a model whose weights are DTensors (tensor plan, FSDP2), on the CPU.
    Collective: every rank calls it; torch's distributed-checkpoint helper gathers each shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
