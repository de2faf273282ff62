"""DeepSpeed's running part: the DeepSpeed config of a plan (deepspeed.json) and the accelerate
section that points at it, each worker's set-up before the model loads, the Trainer arguments, the
final save and the report of what ran. `deepspeed.DeepSpeedBackend` composes it with the planning part
(`deepspeed_plan`).

On the CPU (gloo) DeepSpeed only sees the right world when Accelerate's state is created for DeepSpeed
*before* the trainer arguments exist (ACCELERATE_USE_DEEPSPEED, then the trainer told to use that
configured state); otherwise Accelerate counts one process while DeepSpeed counts all of them. The
same order works on GPUs, so it is the one path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.base import BackendSpec, common_report, full_state_dict_save, streamed_final_save
from recipeforge.backends.deepspeed_plan import zero_part
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, Trainer

    from recipeforge.config.schema import Recipe
    from recipeforge.stages.context import StageContext, WorkerHooks


class DeepSpeedRuntime(BackendSpec):
    """What the launcher and each worker ask of DeepSpeed: configs, worker hooks, the final save, the report."""

    def launcher(self, plan: Plan) -> str:
        return "accelerate"  # even one process: the DeepSpeed engine needs a launched worker

    def config(self, plan: Plan, recipe: Recipe) -> dict[str, Any]:
        """The DeepSpeed config dict of this plan."""
        from recipeforge.backends.artifacts import deepspeed_config

        return deepspeed_config(plan, recipe)

    def accelerate_config(self, plan: Plan, recipe: Recipe, run_dir: Path) -> dict[str, Any]:
        return {"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"deepspeed_config_file": str(run_dir / "deepspeed.json"),
                                     # as in `setup_worker`: checkpoints load partitioned
                                     "zero3_init_flag": zero_part(plan).zero_stage == 3 and not _random_init(recipe),
                                     # one launcher per node (torch's elastic agent), like DDP; no ssh/pdsh
                                     "deepspeed_multinode_launcher": "standard"}}

    def launch_files(self, plan: Plan, recipe: Recipe) -> dict[str, str]:
        import json

        return {"deepspeed.json": json.dumps(self.config(plan, recipe), indent=2) + "\n"}

    def launch_env(self, plan: Plan) -> dict[str, str]:
        from recipeforge.backends.deepspeed_ops import extensions_dir

        return {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or extensions_dir()}

    def setup_worker(self, ctx: StageContext) -> WorkerHooks:
        """Accelerate's state for DeepSpeed (see the module); under ZeRO-3 the base goes straight into
        partitions: a checkpoint through zero.Init, or, for a 4-bit QLoRA base and for any random-init
        model, tensor by tensor (`sharded_loading`)."""
        from accelerate import PartialState

        from recipeforge.backends import deepspeed_ops
        from recipeforge.log import log
        from recipeforge.stages.context import WorkerHooks

        os.environ.setdefault("TORCH_EXTENSIONS_DIR", deepspeed_ops.extensions_dir())
        # Built here, one rank at a time, before DeepSpeed asks for them (and would wait for ever on a lock
        # a stopped build left): the shared-memory all-reduce at its start, CPU Adam at the optimizer.
        deepspeed_ops.ensure_built(deepspeed_ops.needed(on_cpu=ctx.plan.device != "cuda",
                                                        offload_optimizer=ctx.plan.offload != "none"),
                                   log=log)
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="nccl" if ctx.plan.device == "cuda" else "gloo")
        self._hf_config = None
        zero3 = zero_part(ctx.plan).zero_stage == 3
        quantized = ctx.recipe.adapter.type == "qlora" and ctx.recipe.adapter.quant.bits == 4
        if zero3 and (quantized or _random_init(ctx.recipe)):
            # No process holds the whole base: placeholders now, the base read or made into ZeRO-3
            # partitions once the trainer (and its DeepSpeed config) exists, before the engine starts.
            from recipeforge.backends import sharded_hooks

            record: dict[str, int] = {}
            return WorkerHooks(load_sharded=sharded_hooks.loader(ctx, record),
                               prepare_trainer=sharded_hooks.partition_and_fill(ctx, record), makes_random=True)
        if zero3:
            # Checkpoints load straight into ZeRO-3 partitions (zero.Init) instead of whole on every
            # process.
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_config = HfDeepSpeedConfig(self.config(ctx.plan, ctx.recipe))  # kept alive: a weakref
        return WorkerHooks()

    def trainer_kwargs(self, ctx: StageContext) -> dict[str, Any]:
        return {"deepspeed": self.config(ctx.plan, ctx.recipe), "use_cpu": False,
                "accelerator_config": {"use_configured_state": True}}

    def save_final(self, ctx: StageContext, trainer: Trainer, model: torch.nn.Module,
                   tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path | None:
        if zero_part(ctx.plan).zero_stage != 3:
            return super().save_final(ctx, trainer, model, tokenizer)
        # Full weights: each partitioned parameter gathered alone (collective) and written by rank 0.
        streamed = streamed_final_save(ctx, model, tokenizer, "zero3", model)
        if streamed is not None:
            return streamed
        # Collective: every rank hands its partition; the main process gets the whole state dict.
        state_dict = trainer.accelerator.get_state_dict(trainer.model_wrapped)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer: Trainer) -> dict[str, Any]:
        report = common_report(trainer)
        engine = trainer.model_wrapped
        report["engine"] = type(engine).__name__
        stage = getattr(engine, "zero_optimization_stage", None)
        report["zero_stage"] = stage() if callable(stage) else None
        params = list(engine.module.parameters()) if hasattr(engine, "module") else []
        # ZeRO-3 keeps a 1/world slice of every parameter (`ds_tensor`) and an empty placeholder.
        report["partitioned_params"] = sum(1 for p in params if hasattr(p, "ds_tensor"))
        report["local_param_elements"] = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                                             for p in params)
        report["full_param_elements"] = sum(getattr(p, "ds_numel", p.numel()) for p in params)
        # QLoRA's 4-bit base weights (bitsandbytes Params4bit, packed into 16-bit words): partitioned too?
        quantized = [p for p in params if type(p).__name__ == "Params4bit"]
        if quantized:
            report["quantized_params"] = len(quantized)
            report["partitioned_quantized_params"] = sum(1 for p in quantized if hasattr(p, "ds_tensor"))
            report["quantized_local_elements"] = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
                                                     for p in quantized)
            report["quantized_full_elements"] = sum(getattr(p, "ds_numel", p.numel()) for p in quantized)
        offload = getattr(engine, "zero_offload_optimizer", None)
        report["offload_optimizer"] = bool(offload()) if callable(offload) else False
        return report


def _random_init(recipe: Recipe) -> bool:
    from recipeforge.components.tiny_spec import tiny_arch

    return tiny_arch(recipe.model.name_or_path) is not None or recipe.model.init == "random"
