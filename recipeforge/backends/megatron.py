"""Megatron-Bridge: tensor / pipeline / data parallel pretraining and SFT (full or LoRA) of Hugging Face models.

The pieces, and where each runs:

* before the job, in the launching process: `prepare_launch` converts the Hugging Face checkpoint to
  Megatron's format once (`megatron_convert.import_checkpoint`, cached);
* in every torchrun worker, on the usual stage protocol: the Megatron stage runner
  (`stages.megatron_lm`) writes the shared data step's token rows in Megatron's formats
  (`components.megatron_data`), builds the `ConfigContainer` with `build_config` (handed to it by
  `trainer_kwargs`) from `megatron_config` (a pure translation of recipe + plan) and runs
  Megatron-Bridge's `finetune` loop. Every rank takes the same path;
* after the job, in the launching process: `finish_launch` exports the last checkpoint to final/
  (`megatron_convert.export_final`) and merges a LoRA adapter when the recipe asks.

What the backend does with each recipe field is in `config.schema.megatron_fields` (validation refuses the rest there, and `check` again).
Megatron-Bridge and Transformer Engine are imported inside functions only. Megatron-Core's forward
needs CUDA, so this backend runs on GPUs only.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from recipeforge.backends.base import TrainerBackend
from recipeforge.errors import Problem, RecipeError

# ConfigContainer field -> Megatron-Bridge 0.6 class (module, name). Built with keyword arguments, so a
# field the installed version does not have fails at construction instead of being dropped.
SECTIONS = {
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "validation": ("megatron.bridge.training.config", "ValidationConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "scheduler": ("megatron.bridge.training.config", "SchedulerConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
    "logger": ("megatron.bridge.training.config", "LoggerConfig"),
    "tokenizer": ("megatron.bridge.training.config", "TokenizerConfig"),
    "rng": ("megatron.bridge.training.config", "RNGConfig"),
    "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
    "peft": ("megatron.bridge.peft.lora", "LoRA"),
}
DATASETS = {"sft": ("megatron.bridge.data.builders", "GPTSFTDatasetConfig")}
PACKING = ("megatron.bridge.data.packing", "PackedSequenceSpecs")
DTYPES = ("params_dtype", "pipeline_dtype")  # written as names in the pure translation


def megatron_installed() -> bool:
    """Whether Megatron-Bridge is installed (looked up, not imported)."""
    from recipeforge.plan.policy import backend_installed

    return backend_installed("megatron")


class MegatronBackend(TrainerBackend):
    """Megatron-Core parallelism through Megatron-Bridge's training loop (its own stage runner)."""

    name = "megatron"
    stages = ("pretrain", "sft")
    exports_after_job = True  # final/ (and a LoRA merge) are written by `finish_launch`

    def check(self, plan, recipe) -> None:
        from recipeforge.backends.megatron_convert import EXTRA_HINT
        from recipeforge.config.schema.megatron_fields import megatron_problems

        if plan.backend != self.name:
            raise RecipeError(f"the plan uses backend {plan.backend}, not megatron", key="distributed.backend")
        # stages, CUDA only, adapters, offload: the capability record (recipeforge.capabilities)
        self.check_supported(plan, recipe)
        problems = megatron_problems(recipe)
        if problems:
            raise RecipeError([Problem(message, key=key) for key, message in problems])
        if not megatron_installed():
            raise RecipeError("the megatron backend needs Megatron-Bridge and Transformer Engine, which are "
                              "not installed", key="distributed.backend", hint=EXTRA_HINT)

    def launcher(self, plan) -> str:
        return "torchrun"  # Megatron initialises its own process groups from torchrun's environment

    def launch_env(self, plan) -> dict[str, str]:
        # Megatron-Core overlaps TP communication with compute only with one CUDA connection.
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

    def launch_files(self, plan, recipe) -> dict[str, str]:
        from recipeforge.plan.artifacts import megatron_parallel_settings

        return {"megatron_parallel.json": json.dumps(megatron_parallel_settings(plan, recipe), indent=2) + "\n"}

    # -- around the job (launching process, one process) ---------------------------------------
    def prepare_launch(self, loaded, plan, run, *, log=print) -> Path:
        """Convert the Hugging Face model before any worker starts; returns the converted entry."""
        from recipeforge.backends.megatron_convert import import_checkpoint

        return import_checkpoint(loaded.recipe, run_root=run.root, log=log)

    def finish_launch(self, loaded, plan, run, *, log=print) -> Path:
        """final/ from the job's last checkpoint, then the LoRA merge when `output.merge_adapter`."""
        from recipeforge.backends.megatron_convert import export_final

        final = export_final(loaded.recipe, run, log=log)
        recipe = loaded.recipe
        if recipe.output.merge_adapter and recipe.adapter.type != "none":
            from recipeforge.outputs.export import merge_adapter

            merge_adapter(run.root)
        return final

    # -- inside each worker ---------------------------------------------------------------------
    def trainer_kwargs(self, ctx) -> dict:
        """The Megatron stage's configuration builder (the stage never imports a backend)."""
        from functools import partial

        return {"build_config": partial(build_config, ctx)}

    def save_final(self, ctx, trainer, model, tokenizer) -> Path | None:
        return None  # final/ is exported after the job (`finish_launch`)

    def runtime_report(self, trainer) -> dict:
        return {}


def converted_base(recipe, run_root: Path) -> Path:
    """The converted checkpoint `prepare_launch` left (same cache key); an error when it is missing."""
    from recipeforge.backends.megatron_convert import _cache_root, base_checkpoint, cache_key
    from recipeforge.components.tiny_spec import tiny_arch

    m = recipe.model
    entry = run_root / "megatron_base" if tiny_arch(m.name_or_path) else \
        _cache_root() / cache_key(m.name_or_path, m.revision, m.trust_remote_code)
    if not (entry / "done.json").is_file():
        raise RecipeError(f"no converted Megatron checkpoint of {m.name_or_path} at {entry}",
                          key="model.name_or_path",
                          hint="start the run with `recipeforge train` (it converts before launching) or run "
                               "`recipeforge convert-checkpoint RECIPE` first; on several nodes, "
                               "$RECIPEFORGE_CACHE must be on a shared filesystem")
    return base_checkpoint(entry)


def build_config(ctx, *, data: dict, train_iters: int):
    """The Megatron-Bridge `ConfigContainer` for this worker (called by the Megatron stage runner)."""
    from recipeforge.backends.megatron_config import megatron_config

    recipe = ctx.recipe
    settings = megatron_config(ctx.plan, recipe, run_dir=ctx.run.root, data=data, train_iters=train_iters,
                               base_checkpoint=converted_base(recipe, ctx.run.root))
    return build_container(settings, recipe, hf_path=_hf_path(recipe, ctx.run.root))


def _hf_path(recipe, run_root: Path) -> str:
    from recipeforge.components.tiny_spec import tiny_arch

    return str(run_root / "base_model") if tiny_arch(recipe.model.name_or_path) else recipe.model.name_or_path


def construct(section: str, klass, values: dict):
    """`klass(**values)`: a field the installed Megatron-Bridge lacks is an error naming it."""
    import torch

    values = {k: getattr(torch, v) if k in DTYPES and isinstance(v, str) else v for k, v in values.items()}
    try:
        return klass(**values)
    except TypeError as exc:
        raise RecipeError(f"the installed Megatron-Bridge does not take {section} settings {sorted(values)}: {exc}",
                          key="distributed.backend",
                          hint="install the version the `megatron` extra pins: pip install 'recipeforge[megatron]'") \
            from None


def _class(spec: tuple[str, str]):
    module, name = spec
    return getattr(importlib.import_module(module), name)


def build_container(settings: dict, recipe, *, hf_path: str):
    """The `ConfigContainer` from `megatron_config`'s sections, every dataclass built with keywords."""
    from recipeforge.backends.megatron_convert import auto_bridge

    from megatron.bridge.training.config import ConfigContainer

    m = recipe.model
    provider = auto_bridge().from_hf_pretrained(hf_path, trust_remote_code=m.trust_remote_code) \
        .to_megatron_provider(load_weights=False)
    for key, value in settings["model"].items():  # the provider exists already: set, but only known fields
        if not hasattr(provider, key):
            raise RecipeError(f"the installed Megatron-Bridge's model provider has no field {key}",
                              key="distributed.backend", hint="pip install 'recipeforge[megatron]'")
        import torch

        setattr(provider, key, getattr(torch, value) if key in DTYPES and isinstance(value, str) else value)
    sections = {name: construct(name, _class(spec), settings[name])
                for name, spec in SECTIONS.items() if settings.get(name) is not None}
    dataset = dict(settings["dataset"])
    kind = dataset.pop("kind")
    specs = dataset.pop("offline_packing_specs", None)
    if specs is not None:
        dataset["offline_packing_specs"] = construct("offline_packing_specs", _class(PACKING), specs)
    sections["dataset"] = construct("dataset", _class(DATASETS[kind]), dataset)
    return ConfigContainer(model=provider, mixed_precision=settings.get("mixed_precision"), **sections)
