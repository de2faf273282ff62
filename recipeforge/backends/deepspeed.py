"""DeepSpeed ZeRO-0/1/2/3 (with CPU optimizer / parameter offload) under the transformers/TRL trainers.

The DeepSpeed config comes from the plan (`plan.artifacts.deepspeed_config`): explicit batch sizes
(micro x accumulation x world), the ZeRO stage, offload, precision. It is written to the run directory
as deepspeed.json for the launcher and humans; each worker builds the same dict from the same plan.

On the CPU (gloo) DeepSpeed only sees the right world when Accelerate's state is created for DeepSpeed
*before* the trainer arguments exist (ACCELERATE_USE_DEEPSPEED, then the trainer told to use that
configured state); otherwise Accelerate counts one process while DeepSpeed counts all of them. The
same order works on GPUs, so it is the one path.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipeforge.backends.base import TrainerBackend, _common_report, full_state_dict_save


def extensions_dir() -> str:
    """Where DeepSpeed's JIT-built extensions are cached (built once per machine, not per run)."""
    from recipeforge.components.lm_data import default_cache_root

    return str(default_cache_root() / "torch_extensions")


class DeepSpeedBackend(TrainerBackend):
    """ZeRO data parallelism through DeepSpeed's engine."""

    name = "deepspeed"

    def launcher(self, plan) -> str:
        return "accelerate"  # even one process: the DeepSpeed engine needs a launched worker

    def config(self, plan, recipe) -> dict:
        """The DeepSpeed config dict of this plan."""
        from recipeforge.plan.artifacts import deepspeed_config

        return deepspeed_config(plan, recipe)

    def accelerate_config(self, plan, recipe, run_dir: Path) -> dict:
        return {"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"deepspeed_config_file": str(run_dir / "deepspeed.json"),
                                     # as in `setup_worker`: checkpoints load partitioned
                                     "zero3_init_flag": plan.zero_stage == 3 and not _random_init(recipe),
                                     # one launcher per node (torch's elastic agent), like DDP; no ssh/pdsh
                                     "deepspeed_multinode_launcher": "standard"}}

    def launch_files(self, plan, recipe) -> dict[str, str]:
        import json

        return {"deepspeed.json": json.dumps(self.config(plan, recipe), indent=2) + "\n"}

    def launch_env(self, plan) -> dict[str, str]:
        return {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or extensions_dir()}

    def setup_worker(self, ctx) -> None:
        """Accelerate's state for DeepSpeed (see the module); under ZeRO-3 a checkpoint loads straight
        into partitions: through zero.Init, or, for a 4-bit QLoRA base, shard by shard
        (`quantized_loading`)."""
        from accelerate import PartialState

        os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="nccl" if ctx.plan.device == "cuda" else "gloo")
        self._hf_config = None
        if ctx.plan.zero_stage == 3 and ctx.recipe.adapter.type == "qlora" and ctx.recipe.adapter.quant.bits == 4:
            # No process loads the whole 4-bit base: placeholders now, the checkpoint read into ZeRO-3
            # partitions once the trainer (and its DeepSpeed config) exists, before the engine starts.
            from recipeforge.backends import quantized_loading

            record: dict = {}
            ctx.load_sharded = quantized_loading.loader(ctx, record)
            ctx.prepare_trainer = quantized_loading.partition_and_fill(ctx, record)
        elif ctx.plan.zero_stage == 3 and not _random_init(ctx.recipe):
            # Checkpoints load straight into ZeRO-3 partitions (zero.Init) instead of whole on every
            # process. A random-init model is built whole (the same weights as on one process, for the
            # same seed) and partitioned when the engine starts.
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_config = HfDeepSpeedConfig(self.config(ctx.plan, ctx.recipe))  # kept alive: a weakref

    def trainer_kwargs(self, ctx) -> dict:
        return {"deepspeed": self.config(ctx.plan, ctx.recipe), "use_cpu": False,
                "accelerator_config": {"use_configured_state": True}}

    def save_final(self, ctx, trainer, model, tokenizer) -> Path | None:
        if ctx.plan.zero_stage != 3:
            return super().save_final(ctx, trainer, model, tokenizer)
        # Collective: every rank hands its partition; the main process gets the whole state dict.
        state_dict = trainer.accelerator.get_state_dict(trainer.model_wrapped)
        return full_state_dict_save(ctx, model, tokenizer, state_dict)

    def runtime_report(self, trainer) -> dict:
        report = _common_report(trainer)
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


def _random_init(recipe) -> bool:
    from recipeforge.components.tiny_spec import tiny_arch

    return tiny_arch(recipe.model.name_or_path) is not None or recipe.model.init == "random"
