"""The worker hooks of a run whose base no process holds whole (FSDP2 and ZeRO-3; `sharded_loading` says how):
the stage's loader builds the placeholder model, the trainer's preparation shards it (FSDP2) or partitions it
(ZeRO-3) and fills it tensor by tensor, and each process reports what it held to
`sharded_loading/rank<N>.json`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.backends.checkpoint_reading import local_checkpoint
from recipeforge.backends.process_memory import released_rss_bytes
from recipeforge.backends.sharded_loading import (base_source, build_placeholder_model, fill_local_shards,
                                                  fill_zero3_partitions, in_engine_dtype, placeholders_to_meta)
from recipeforge.components.model_init import RandomInit

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from transformers import PreTrainedModel, Trainer

    from recipeforge.stages.context import StageContext


def loader(ctx: StageContext, record: dict[str, int]) -> Callable[..., Any]:
    """The `StageContext.load_sharded` of a base no process holds whole under FSDP2 and ZeRO-3 (a
    4-bit QLoRA checkpoint, or any random-init model: `random=`): the placeholder model, which the
    stage freezes and gives its adapters as for a whole load. `record` gets this process's resident
    memory before and after building, which `write_report` reports with the loading's own."""
    from recipeforge.components.adapters import quantization_config

    adapter, device = ctx.recipe.adapter, ctx.plan.device

    def load_sharded(path: str, *, dtype: torch.dtype, attn_implementation: str, revision: str | None = None,
                     trust_remote_code: bool = False, random: RandomInit | None = None) -> Any:
        quant = None
        if adapter.type == "qlora":
            quant = quantization_config(adapter, dtype, device, location=ctx.locate(("adapter", "type")))
        local = None if random is not None else \
            local_checkpoint(path, revision, location=ctx.locate(("model", "name_or_path")))
        record["rss_before"] = released_rss_bytes()
        model = build_placeholder_model(local, quant, dtype=dtype, attn_implementation=attn_implementation,
                                        trust_remote_code=trust_remote_code, name=path, random=random)
        record["rss_built"] = released_rss_bytes()
        return model

    return load_sharded


def shard_and_fill(ctx: StageContext, record: dict[str, int]) -> Callable[[Any], None]:
    """The `StageContext.prepare_trainer` of a base loaded by `loader` under FSDP2: the trainer's own
    Accelerator shards the placeholder model (the same `fully_shard` calls a whole model gets), then
    the local shards are read from the checkpoint or made, before the trainer builds its optimizer on
    the trainable ones. This process's numbers go to `sharded_loading/rank<N>.json` (`write_report`)."""

    def prepare(trainer: Trainer) -> None:
        source = base_source(trainer.model)
        if source is None:  # a model loaded another way
            return
        prepared = shard_with_accelerator(trainer)
        rss_sharded = released_rss_bytes()
        device, shard_device = _devices(trainer.accelerator)
        stats = fill_local_shards(prepared, source, compute_dtype=_compute_dtype(prepared), device=device,
                                  shard_device=shard_device)
        write_report(ctx, record, stats, rss_sharded, source)

    return prepare


def partition_and_fill(ctx: StageContext, record: dict[str, int]) -> Callable[[Any], None]:
    """The `StageContext.prepare_trainer` of a base loaded by `loader` under DeepSpeed ZeRO-3: the
    base is read or made into ZeRO-3 partitions of the placeholder model (`fill_zero3_partitions`,
    with the trainer's DeepSpeed config) before the trainer starts the engine, which then finds the
    base partitioned and partitions the adapters like it. This process's numbers go to
    `sharded_loading/rank<N>.json` (`write_report`)."""

    def prepare(trainer: Trainer) -> None:
        source = base_source(trainer.model)
        if source is None:  # a model loaded another way
            return
        rss_start = released_rss_bytes()
        ds_config = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
        stats = fill_zero3_partitions(trainer.model, source, compute_dtype=_compute_dtype(trainer.model),
                                      ds_config=ds_config, device=trainer.accelerator.device)
        in_engine_dtype(trainer.model, ds_config)
        write_report(ctx, record, stats, rss_start, source)

    return prepare


def write_report(ctx: StageContext, record: dict[str, int], stats: dict[str, Any], rss_before_fill: int,
                 source: str | RandomInit | None = None) -> None:
    """Write this process's loading figures (`fill_base`'s, plus its resident memory growth,
    `released_rss_bytes`: the peak of the samples and what is held at the end, while filling the base
    and from the start of loading) to `sharded_loading/rank<N>.json` in the run directory.
    `rss_before_fill`: the resident size right before the base was filled."""
    fill_peak, held = stats.pop("rss_peak_bytes"), released_rss_bytes()
    # The filling alone: the base's own cost, apart from what building the skeleton, the adapters
    # and the trainer costs whatever the model's size.
    stats["fill_rss_peak_growth_bytes"] = fill_peak - rss_before_fill
    stats["fill_rss_held_growth_bytes"] = held - rss_before_fill
    if "rss_before" in record:  # the whole load, from before the skeleton was built
        stats["rss_peak_growth_bytes"] = max(record["rss_built"], rss_before_fill, fill_peak) - record["rss_before"]
        stats["rss_held_growth_bytes"] = held - record["rss_before"]
        stats["skeleton_rss_growth_bytes"] = record["rss_built"] - record["rss_before"]
    stats["rank"] = ctx.dist.rank
    stats["source"] = "random init" if isinstance(source, RandomInit) else "checkpoint"
    out = ctx.run.root / "sharded_loading" / f"rank{ctx.dist.rank}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stats, indent=2) + "\n")
    what = "4-bit base" if stats["quant_state_bytes"] else "base"
    how = "made" if isinstance(source, RandomInit) else "loaded"
    ctx.log(f"{what} {how} sharded: {stats['local_base_bytes'] / 2**20:.1f} MiB of "
            f"{stats['full_base_bytes'] / 2**20:.1f} MiB on rank {ctx.dist.rank}")


def _compute_dtype(model: PreTrainedModel) -> torch.dtype | None:
    """The dtype 4-bit weights are quantized from (the quantization config's compute dtype), or None
    for a model without 4-bit layers."""
    config = getattr(model.config, "quantization_config", None)
    dtype: torch.dtype | None = getattr(config, "bnb_4bit_compute_dtype", None)
    return dtype


def _devices(accelerator: Accelerator) -> tuple[torch.device, torch.device | str]:
    """Where tensors are quantized (the training device) and where the shards stay (the CPU when
    FSDP2 offloads parameters, else the training device)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    device = accelerator.device
    offload = isinstance(accelerator.state.fsdp_plugin.cpu_offload, CPUOffloadPolicy)
    return device, ("cpu" if offload else device)


def shard_with_accelerator(trainer: Trainer) -> torch.nn.Module:
    """Shard the trainer's model now, with the trainer's Accelerator and the steps its FSDP2 prepare
    takes for a model (accelerate/accelerator.py `_prepare_fsdp2`: wrap policy, activation
    checkpointing, `fsdp2_prepare_model`), the placeholders turned into meta tensors first. The
    trainer gets the sharded model back; when training starts it builds its optimizer on it and
    prepares both, and `fsdp2_prepare_model` leaves a model that already is an FSDP module as it
    is. (Accelerate's `prepare` itself refuses a model without its optimizer under FSDP2.)"""
    from accelerate.utils import fsdp2_apply_ac, fsdp2_prepare_model

    accelerator = trainer.accelerator
    plugin = accelerator.state.fsdp_plugin
    model: torch.nn.Module = trainer.model
    placeholders_to_meta(model)
    # The shards are filled here (`fill_local_shards`), not broadcast from the main process's model,
    # which holds placeholders like every other's.
    plugin.cpu_ram_efficient_loading = False
    plugin.set_auto_wrap_policy(model)
    if plugin.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)
        # Applied once here; the trainer's prepare would wrap the wrapped layers again.
        plugin.activation_checkpointing = False
    model = fsdp2_prepare_model(accelerator, model)
    trainer.model = trainer.model_wrapped = model
    return model
