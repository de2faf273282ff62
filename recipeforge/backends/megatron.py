"""Megatron-Bridge: tensor / pipeline / data parallel pretraining and SFT (full or LoRA) of Hugging Face models.

Flow inside each torchrun worker: the HF checkpoint is imported once into Megatron's distributed format
(`AutoBridge.import_ckpt`), the recipe's data is written in a form Megatron-Bridge reads (an indexed token
dataset for pretraining, input/output JSONL for SFT), the `ConfigContainer` is built from
`megatron_config` (a pure translation of recipe + plan), Megatron-Bridge's own `pretrain` / `finetune`
loop runs, and the last checkpoint is exported to Hugging Face safetensors in final/ (LoRA adapters are
merged first). Megatron-Bridge and Transformer Engine are imported only here, inside the functions.

Megatron-Core's forward needs CUDA, so this backend runs on GPUs only; its tests there are marked `gpu`.
"""

from __future__ import annotations

import json
from pathlib import Path

from recipeforge.backends.base import TrainerBackend
from recipeforge.errors import RecipeError

SECTIONS = {  # ConfigContainer field -> Megatron-Bridge class (module, name)
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "validation": ("megatron.bridge.training.config", "ValidationConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "scheduler": ("megatron.bridge.training.config", "SchedulerConfig"),
    "ddp": ("megatron.core.distributed", "DistributedDataParallelConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "logger": ("megatron.bridge.training.config", "LoggerConfig"),
    "tokenizer": ("megatron.bridge.training.config", "TokenizerConfig"),
    "rng": ("megatron.bridge.training.config", "RNGConfig"),
    "peft": ("megatron.bridge.peft.lora", "LoRA"),
}
DATASETS = {"gpt": ("megatron.bridge.training.config", "GPTDatasetConfig"),
            "sft": ("megatron.bridge.training.config", "FinetuningDatasetConfig")}


def megatron_installed() -> bool:
    """Whether Megatron-Bridge is installed (looked up, not imported)."""
    from recipeforge.plan.policy import backend_installed

    return backend_installed("megatron")


class MegatronBackend(TrainerBackend):
    """Megatron-Core parallelism through Megatron-Bridge's training loop (it trains the stage itself)."""

    name = "megatron"
    stages = ("pretrain", "sft")
    trains_itself = True

    def check(self, plan, recipe) -> None:
        if plan.backend != self.name:
            raise RecipeError(f"the plan uses backend {plan.backend}, not megatron", key="distributed.backend")
        # stages, CUDA only, adapters, offload: the capability record (recipeforge.capabilities)
        self.check_supported(plan, recipe)
        if not megatron_installed():
            raise RecipeError("the megatron backend needs Megatron-Bridge and Transformer Engine, which are "
                              "not installed", key="distributed.backend",
                              hint="pip install 'recipeforge[megatron]' (Megatron-Bridge needs Python 3.12 "
                                   "and CUDA), or use backend: auto")

    def launcher(self, plan) -> str:
        return "torchrun"  # Megatron initialises its own process groups from torchrun's environment

    def launch_env(self, plan) -> dict[str, str]:
        # Megatron-Core overlaps TP communication with compute only with one CUDA connection.
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

    def launch_files(self, plan, recipe) -> dict[str, str]:
        from recipeforge.plan.artifacts import megatron_parallel_settings

        return {"megatron_parallel.json": json.dumps(megatron_parallel_settings(plan, recipe), indent=2) + "\n"}

    # -- the worker ---------------------------------------------------------------------------------
    def train_stage(self, ctx) -> dict:
        """Prepare data and base checkpoint, run Megatron-Bridge's loop, export final/. Returns data stats."""
        import torch.distributed as dist

        from recipeforge.backends.megatron_config import megatron_config

        recipe, run = ctx.recipe, ctx.run
        stats, data, rows = _prepare_data(ctx)
        if ctx.dist.is_main and not (run.root / "megatron_base").exists():
            _import_base(recipe, run.root / "megatron_base")
        if dist.is_initialized():
            dist.barrier()
        steps = recipe.train.max_steps or max(1, int(recipe.train.epochs * rows // ctx.plan.global_batch_size))
        config = build_container(megatron_config(ctx.plan, recipe, run_dir=run.root, data=data, train_iters=steps),
                                 recipe)
        from megatron.bridge.training.finetune import finetune
        from megatron.bridge.training.gpt_step import forward_step

        # Every recipe starts from a Hugging Face model (its weights imported above), so pretraining is
        # continued pretraining: Megatron-Bridge's `finetune` is `pretrain` from `pretrained_checkpoint`.
        finetune(config=config, forward_step_func=forward_step)
        if dist.is_initialized():
            dist.barrier()
        if ctx.dist.is_main:
            export_final(recipe, run.root / "checkpoints", run.final, lora=recipe.adapter.type == "lora",
                         base=run.root / "megatron_base")
        return stats


def build_container(settings: dict, recipe):
    """The Megatron-Bridge `ConfigContainer` from `megatron_config`'s sections; a field the installed
    Megatron-Bridge lacks is an error naming it (never silently dropped)."""
    import importlib

    from megatron.bridge import AutoBridge
    from megatron.bridge.training.config import ConfigContainer, DistributedInitConfig

    m = recipe.model
    provider = AutoBridge.from_hf_pretrained(m.name_or_path, trust_remote_code=m.trust_remote_code) \
        .to_megatron_provider(load_weights=False)
    _apply(provider, settings["model"], "model")
    settings = dict(settings)
    sections = {}
    for name, (module, cls) in SECTIONS.items():
        if settings.get(name) is None:
            continue
        klass = getattr(importlib.import_module(module), cls, None)
        if klass is None and name == "validation":
            # Older Megatron-Bridge keeps the evaluation settings on TrainingConfig.
            settings["train"] = {**settings["train"], **settings["validation"]}
            continue
        sections[name] = _apply(klass(), settings[name], name)
    if "validation" not in sections and "train" in sections:
        _apply(sections["train"], {k: v for k, v in settings["train"].items()}, "train")
    dataset = dict(settings["dataset"])
    module, cls = DATASETS[dataset.pop("kind")]
    sections["dataset"] = getattr(importlib.import_module(module), cls)(**dataset)
    return ConfigContainer(model=provider, dist=DistributedInitConfig(),
                           mixed_precision=settings.get("mixed_precision"), **sections)


def _apply(obj, values: dict, section: str):
    import torch

    for key, value in values.items():
        if not hasattr(obj, key):
            raise RecipeError(f"the installed Megatron-Bridge has no {section}.{key}", key="distributed.backend",
                              hint="install the Megatron-Bridge version the `megatron` extra pins")
        if key in ("params_dtype", "pipeline_dtype") and isinstance(value, str):
            value = getattr(torch, value)
        setattr(obj, key, value)
    return obj


def _prepare_data(ctx) -> tuple[dict, dict, int]:
    """Write the recipe's data where Megatron-Bridge reads it (main process), using recipeforge's own
    tokenization and formats so masking and chat templates match the other backends."""
    import torch.distributed as dist

    from recipeforge.stages import runner_class

    recipe = ctx.recipe
    if recipe.stage == "sft" and recipe.data.packing:
        # Megatron-Bridge packs SFT rows itself; it needs one prompt/answer pair per row.
        from dataclasses import replace

        recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"packing": False})})
        ctx = replace(ctx, loaded=replace(ctx.loaded, recipe=recipe))
    runner = runner_class(recipe.stage)(ctx)
    runner.tokenizer = runner.load_tokenizer()
    out = ctx.run.root / "megatron_data"
    if ctx.recipe.stage == "pretrain":
        data = {"kind": "pretrain", "prefix": out / "train_text_document"}
    else:
        data = {"kind": "sft", "root": out, "has_eval": bool(ctx.recipe.data.val_size or ctx.recipe.data.eval_datasets)}
    rows = 0
    if ctx.dist.is_main:
        runner.prepare_data()
        rows = _write_dataset(runner.data, runner.tokenizer, data, out)
    if dist.is_initialized():
        box = [rows]
        dist.broadcast_object_list(box, src=0)
        rows = box[0]
    return dict(getattr(runner, "data_stats", {})), data, rows


def _write_dataset(lm_data, tokenizer, data: dict, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    if data["kind"] == "pretrain":
        import numpy as np
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        builder = IndexedDatasetBuilder(f"{data['prefix']}.bin", dtype=np.int32)
        for row in lm_data.train:
            ids = torch.tensor(row["input_ids"], dtype=torch.int32)
            builder.add_document(ids, [len(ids)])
        builder.finalize(f"{data['prefix']}.idx")
        return len(lm_data.train)
    # SFT: prompt (untrained tokens) and answer (trained tokens) as text, one JSON row each.
    for split, rows in (("training", lm_data.train), ("validation", lm_data.eval)):
        if rows is None:
            continue
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                ids, labels = row["input_ids"], row["labels"]
                prompt = [t for t, lab in zip(ids, labels) if lab == -100]
                answer = [t for t, lab in zip(ids, labels) if lab != -100]
                fh.write(json.dumps({"input": tokenizer.decode(prompt), "output": tokenizer.decode(answer)}) + "\n")
    return len(lm_data.train)


def _import_base(recipe, path: Path) -> None:
    from megatron.bridge import AutoBridge

    AutoBridge.import_ckpt(recipe.model.name_or_path, str(path), trust_remote_code=recipe.model.trust_remote_code)


def export_final(recipe, checkpoints: Path, final: Path, *, lora: bool, base: Path) -> None:
    """Megatron checkpoint -> Hugging Face safetensors in final/ (LoRA adapters merged into the base)."""
    from megatron.bridge import AutoBridge

    m = recipe.model
    bridge = AutoBridge.from_hf_pretrained(m.name_or_path, trust_remote_code=m.trust_remote_code)
    source = latest_checkpoint(checkpoints)
    if lora:
        merged = checkpoints.parent / "megatron_merged"
        _merge_lora(bridge, base, source, merged, recipe)
        source = merged
    bridge.export_ckpt(megatron_path=str(source), hf_path=str(final))


def latest_checkpoint(checkpoints: Path) -> Path:
    """The newest ``iter_*`` directory Megatron saved (it records the number in a tracker file)."""
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        return checkpoints / f"iter_{int(tracker.read_text().strip()):07d}"
    found = sorted(checkpoints.glob("iter_*"))
    if not found:
        raise RecipeError(f"Megatron wrote no checkpoint under {checkpoints}", key="output.save_steps")
    return found[-1]


def _merge_lora(bridge, base: Path, lora_dir: Path, out: Path, recipe) -> None:
    """Megatron-Bridge's LoRA merge: base weights + adapter tensors -> one dense Megatron checkpoint."""
    from megatron.bridge.training.checkpointing import (_generate_model_state_dict,
                                                        apply_peft_adapter_filter_to_state_dict)
    from megatron.bridge.training.model_load_save import save_megatron_model
    from megatron.bridge.peft.lora import LoRA, LoRAMerge
    from megatron.core import dist_checkpointing

    from recipeforge.backends.megatron_config import _lora

    provider = bridge.to_megatron_provider(load_weights=False)
    provider.tensor_model_parallel_size = provider.pipeline_model_parallel_size = 1
    provider.initialize_model_parallel(seed=recipe.train.seed)
    model = bridge.load_megatron_model(str(base), wrap_with_ddp=False)
    settings = {k: v for k, v in _lora(recipe).items() if k in ("target_modules", "dim", "alpha", "dropout")}
    peft = LoRA(**settings)
    model = peft(model, training=False)
    sharded = apply_peft_adapter_filter_to_state_dict(_generate_model_state_dict(model, {}), peft)
    loaded = dist_checkpointing.load(sharded, str(lora_dir))
    model[0].load_state_dict(loaded["model"], strict=False)
    save_megatron_model([LoRAMerge()(model[0], training=False)], out)
