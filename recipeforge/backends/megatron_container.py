"""The Megatron-Bridge `ConfigContainer` a Megatron worker trains with: `megatron_config`'s pure sections
applied to the real Megatron-Bridge classes (each built with keywords, so a field the installed version
lacks is an error naming it), on the checkpoint `prepare_launch` converted."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.config.schema import Recipe
    from recipeforge.stages.context import StageContext

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
    "rerun_state_machine": ("megatron.bridge.training.config", "RerunStateMachineConfig"),
    "peft": ("megatron.bridge.peft.lora", "LoRA"),
}
DATASETS = {"sft": ("megatron.bridge.data.builders", "GPTSFTDatasetConfig")}
PACKING = ("megatron.bridge.data.packing", "PackedSequenceSpecs")
DTYPES = ("params_dtype", "pipeline_dtype")  # written as names in the pure translation


def converted_base(recipe: Recipe, run_root: Path) -> Path:
    """The converted checkpoint `prepare_launch` left (same cache key); an error when it is missing."""
    from recipeforge.backends.megatron_convert import _cache_root, base_checkpoint, cache_key
    from recipeforge.backends.megatron_weights import layer_spec_name
    from recipeforge.components.tiny_spec import tiny_arch

    m = recipe.model
    entry = run_root / "megatron_base" if tiny_arch(m.name_or_path) else \
        _cache_root() / cache_key(m.name_or_path, m.revision, m.trust_remote_code, layer_spec_name())
    if not (entry / "done.json").is_file():
        raise RecipeError(f"no converted Megatron checkpoint of {m.name_or_path} at {entry}",
                          key="model.name_or_path",
                          hint="start the run with `recipeforge train` (it converts before launching) or run "
                               "`recipeforge convert-checkpoint RECIPE` first; on several nodes, "
                               "$RECIPEFORGE_CACHE must be on a shared filesystem")
    return base_checkpoint(entry)


def build_config(ctx: StageContext, *, data: dict[str, Any], train_iters: int) -> Any:
    """The Megatron-Bridge `ConfigContainer` for this worker (called by the Megatron stage runner)."""
    from recipeforge.backends.megatron_config import megatron_config

    recipe = ctx.recipe
    settings = megatron_config(ctx.plan, recipe, run_dir=ctx.run.root, data=data, train_iters=train_iters,
                               base_checkpoint=converted_base(recipe, ctx.run.root))
    return build_container(settings, recipe, hf_path=_hf_path(recipe, ctx.run.root))


def _hf_path(recipe: Recipe, run_root: Path) -> str:
    from recipeforge.components.tiny_spec import tiny_arch

    return str(run_root / "base_model") if tiny_arch(recipe.model.name_or_path) else recipe.model.name_or_path


def construct(section: str, klass: Callable[..., Any], values: dict[str, Any]) -> Any:
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


def _class(spec: tuple[str, str]) -> Any:
    module, name = spec
    return getattr(importlib.import_module(module), name)


def build_container(settings: dict[str, Any], recipe: Recipe, *, hf_path: str) -> Any:
    """The `ConfigContainer` from `megatron_config`'s sections, every dataclass built with keywords."""
    from recipeforge.backends.megatron_bridge import auto_bridge

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
