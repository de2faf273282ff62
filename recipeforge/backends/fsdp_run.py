"""FSDP2's running part: the accelerate config and Trainer arguments of a plan, each worker's set-up
before the model loads, the final save and the report of what ran. `fsdp.FSDPBackend` composes it
with the planning part (`fsdp_plan`).

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
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, common_report, full_state_dict_save, streamed_final_save
from recipeforge.backends.fsdp_plan import fsdp_part
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer
    import torch

    from recipeforge.config.schema import Recipe
    from recipeforge.stages.context import StageContext, WorkerHooks


class FSDPRuntime(BackendSpec):
    """What the launcher and each worker ask of FSDP2: configs, worker hooks, the final save, the report."""

    def launcher(self, plan: Plan) -> str:
        # Even one process: FSDP2 needs a launched worker and its process group (one GPU with CPU
        # offload is an FSDP job of one rank; in-process training would drop the plugin).
        return "accelerate"

    def plugin(self, plan: Plan, recipe: Recipe) -> dict[str, Any]:
        """Keyword arguments of Accelerate's ``FullyShardedDataParallelPlugin`` (the planner's)."""
        from recipeforge.backends.artifacts import fsdp_plugin_config

        return fsdp_plugin_config(plan, recipe)

    def _hybrid(self, plan: Plan) -> bool:
        from recipeforge.backends.artifacts import fsdp_sharding

        return fsdp_sharding(plan) == "hybrid_shard"

    def accelerate_config(self, plan: Plan, recipe: Recipe, run_dir: Path) -> dict[str, Any]:
        from recipeforge.backends import parallelism

        if parallelism.expert_parallel(plan):
            # Experts (and FSDP2 over the rest) sharded by transformers at load, as for tensor parallel.
            return {"distributed_type": "MULTI_GPU"}
        if parallelism.tensor_parallel(plan):
            # transformers shards the model at load (tensor plan + FSDP2); Accelerate's FSDP plugin
            # would shard it again, so the job runs as MULTI_GPU with the matching ParallelismConfig.
            return {"distributed_type": "MULTI_GPU", **parallelism.accelerate_parallelism_section(plan)}
        p = self.plugin(plan, recipe)
        fsdp: dict[str, Any] = {"fsdp_version": 2,
                "fsdp_auto_wrap_policy": p["auto_wrap_policy"],
                "fsdp_reshard_after_forward": p["reshard_after_forward"],
                "fsdp_offload_params": p["cpu_offload"],
                "fsdp_state_dict_type": p["state_dict_type"],
                "fsdp_cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                "fsdp_activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(p["transformer_cls_names_to_wrap"])
        out: dict[str, Any] = {"distributed_type": "FSDP", "fsdp_config": fsdp}
        if self._hybrid(plan) and fsdp_part(plan).dp_replicate <= 1:  # a plan without the mesh sizes
            out["parallelism_config"] = {"parallelism_config_dp_replicate_size": plan.nodes,
                                         "parallelism_config_dp_shard_size": plan.gpus_per_node}
        else:
            out.update(parallelism.accelerate_parallelism_section(plan))
        return out

    def setup_worker(self, ctx: StageContext) -> WorkerHooks:
        """On the CPU, the process state Accelerate turns into FSDP (see the module); with tensor
        parallelism, the stage loads the model sharded (`parallelism.load_tensor_parallel`); a 4-bit
        QLoRA base and any random-init model are read or made shard by shard (`sharded_loading`)."""
        from recipeforge.backends import parallelism
        from recipeforge.components.tiny_spec import tiny_arch
        from recipeforge.stages.context import WorkerHooks

        if ctx.plan.device != "cuda":
            configure_cpu_state()

        if parallelism.expert_parallel(ctx.plan):
            return parallelism.expert_parallel_hooks(ctx)
        if parallelism.tensor_parallel(ctx.plan):
            plan = ctx.plan

            def load_sharded(path: str, *, dtype: torch.dtype, attn_implementation: str,
                             revision: str | None = None, trust_remote_code: bool = False) -> Any:
                return parallelism.load_tensor_parallel(path, plan, dtype=dtype,
                                                        attn_implementation=attn_implementation,
                                                        revision=revision, trust_remote_code=trust_remote_code)

            return WorkerHooks(load_sharded=load_sharded)
        recipe = ctx.recipe
        quantized = recipe.adapter.type == "qlora" and recipe.adapter.quant.bits == 4
        random = recipe.model.init == "random" or tiny_arch(recipe.model.name_or_path) is not None
        if quantized or random:
            # No process holds the whole base: placeholders now, shards after `fully_shard`.
            from recipeforge.backends import sharded_hooks

            record: dict[str, int] = {}
            return WorkerHooks(load_sharded=sharded_hooks.loader(ctx, record),
                               prepare_trainer=sharded_hooks.shard_and_fill(ctx, record), makes_random=True)
        return WorkerHooks()

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        from transformers import TrainingArguments

        from recipeforge.backends import parallelism

        if parallelism.tensor_parallel(ctx.plan):
            # A model sharded at load: the Trainer prepares it without Accelerate's FSDP plugin, and
            # checkpoints its weights only (transformers cannot resume such a model's optimizer).
            return {"parallelism_config": parallelism.parallelism_config(ctx.plan), "save_only_model": True,
                    **_cpu_kwargs(ctx.plan)}
        if parallelism.expert_parallel(ctx.plan):
            # Sharded at load too (experts over the ep mesh, FSDP2 over the rest): the Trainer saves the
            # weights, `backends.expert_parallel.attach` the sharded optimizer state next to them.
            return {"save_only_model": True, **_cpu_kwargs(ctx.plan)}
        p = self.plugin(ctx.plan, ctx.recipe)
        config: dict[str, Any] = {"version": 2, "auto_wrap_policy": p["auto_wrap_policy"],
                  "reshard_after_forward": p["reshard_after_forward"], "cpu_offload": p["cpu_offload"],
                  "state_dict_type": p["state_dict_type"],
                  "cpu_ram_efficient_loading": p["cpu_ram_efficient_loading"],
                  "activation_checkpointing": p["activation_checkpointing"]}
        if p.get("transformer_cls_names_to_wrap"):
            config["transformer_layer_cls_to_wrap"] = p["transformer_cls_names_to_wrap"]
        # FSDP recomputes per wrapped layer itself; the trainer's own switch would add an all-gather.
        ckpt = ("activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                else "gradient_checkpointing")
        kwargs: dict[str, Any] = {"fsdp": True, "fsdp_config": config, ckpt: False, **_cpu_kwargs(ctx.plan)}
        if self._hybrid(ctx.plan) and fsdp_part(ctx.plan).dp_replicate <= 1:  # a plan without the mesh sizes
            from accelerate import ParallelismConfig

            kwargs["parallelism_config"] = ParallelismConfig(dp_replicate_size=ctx.plan.nodes,
                                                             dp_shard_size=ctx.plan.gpus_per_node)
        elif parallelism.parallelism_config_kwargs(ctx.plan) is not None:
            # context parallel (cp_size) and/or replicas: Accelerate builds the mesh, the Trainer splits sequences
            kwargs["parallelism_config"] = parallelism.parallelism_config(ctx.plan)
        return kwargs

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        from recipeforge.backends import parallelism

        if parallelism.expert_parallel(ctx.plan):
            # Collective: the expert plan's and FSDP2's DTensor shards gathered into full CPU tensors, in the
            # model's own checkpoint layout (per-expert weights).
            parallelism.original_format(model)
            return full_state_dict_save(ctx, model, tokenizer, gathered_state_dict(trainer.model))
        # Full weights: written tensor by tensor (collective), so rank 0 never holds the whole model.
        streamed = streamed_final_save(ctx, model, tokenizer, "dtensor", trainer.model)
        if streamed is not None:
            return streamed
        if parallelism.tensor_parallel(ctx.plan):
            # Collective: DTensor shards (tensor plan and FSDP2) gathered into full CPU tensors.
            return full_state_dict_save(ctx, model, tokenizer, gathered_state_dict(trainer.model))
        # Collective: the shards are all-gathered into a full CPU state dict on the main process.
        state_dict = trainer.accelerator.get_state_dict(trainer.model)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        report = common_report(trainer)
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
        held = getattr(trainer, "rf_expert_parallel", None)
        if held is not None:  # this rank's experts, read from the model at load (`backends.expert_parallel`)
            report["expert_parallel"] = held
        # QLoRA: bitsandbytes' 4-bit linears, whose packed weights (16-bit words) FSDP2 shards too
        # (bitsandbytes' own class: peft's LoRA wrapper of such a layer is named Linear4bit too)
        quantized = [m for m in model.modules()
                     if type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes")]
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


def _cpu_kwargs(plan: Plan) -> dict[str, Any]:
    """Trainer arguments that keep the state `configure_cpu_state` made (use_cpu would rebuild it)."""
    if plan.device == "cuda":
        return {}
    return {"use_cpu": False, "accelerator_config": {"use_configured_state": True}}


def gathered_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """The full state dict of a model whose weights are DTensors (tensor plan, FSDP2), on the CPU.
    Collective: every rank calls it; torch's distributed-checkpoint helper gathers each shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
