"""The tokenizer and what a loaded base model gets before its trainer wraps it: the recipe's tokens,
the unfrozen parameters of a partial fine-tune, a VLM's frozen tower, mixture-of-experts settings,
QAT's fake quantization and fp8's float8 layers. Functions of the context and the model; the runner
keeps what they return."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from recipeforge.errors import RecipeError
from recipeforge.stages.context import RecipeContext, StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from recipeforge.components.vocab import VocabChange

LogSources = list[Callable[[], dict[str, Any]]]


def load_tokenizer(ctx: RecipeContext) -> tuple[Any, VocabChange]:
    """The recipe's tokenizer, with the chat template and the recipe's tokens added (before anything
    is tokenized: the data cache key includes them), and what was added."""
    from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
    from recipeforge.components.tokenizer import load_tokenizer as load
    from recipeforge.components.vocab import prepare_tokenizer

    m = ctx.recipe.model
    arch = tiny_arch(m.name_or_path)
    vocab = TINY_CONFIGS.get(arch, {}).get("vocab_size") if arch else None
    tokenizer = load(m.tokenizer or m.name_or_path, revision=m.revision,
                     trust_remote_code=m.trust_remote_code, vocab_size=vocab,
                     location=ctx.locate(("model", "tokenizer" if m.tokenizer else "name_or_path")),
                     key="model.tokenizer" if m.tokenizer else "model.name_or_path")
    # The model builder gives the new tokens their embedding rows.
    change = prepare_tokenizer(tokenizer, ctx.recipe, base_dir=ctx.base_dir, locate=ctx.locate)
    if change.new_ids:
        ctx.log(f"vocab: {change.describe()}; their embedding rows start at the mean of the others "
                f"and are trained")
    return tokenizer, change


def finish_base(ctx: StageContext, model: PreTrainedModel, log_sources: LogSources) -> None:
    """Everything the recipe does to a freshly built base `model` before its trainer gets it, in place:
    MoE settings (their records added to `log_sources`), only the unfrozen parameters trainable in a
    partial full fine-tune, a VLM's tower frozen, QAT's fake quantizers, fp8's float8 layers."""
    from recipeforge.stages.freezing import apply_unfrozen_parameters

    recipe = ctx.recipe
    setup_moe(ctx, model, log_sources)
    if recipe.train.unfrozen_parameters:
        apply_unfrozen_parameters(model, list(recipe.train.unfrozen_parameters), locate=ctx.locate, log=ctx.log)
    from recipeforge.components.vision_model import freeze_vision, is_vision_model

    if is_vision_model(model) and recipe.adapter.type == "none":
        # Full fine-tuning of a VLM: the tower and the projector train only when the recipe says so.
        freeze_vision(model, recipe.model.vision, log=ctx.log, location=ctx.locate(("model", "name_or_path")))
    if recipe.train.qat is not None:
        fake_quantize(ctx, model)
    from recipeforge.stages import fp8

    if fp8.trains_fp8(ctx.plan):  # float8 matmuls, before the trainer wraps or compiles the model
        fp8.convert(ctx, model)


def setup_moe(ctx: StageContext, model: PreTrainedModel, log_sources: LogSources) -> Any:
    """A mixture-of-experts model: its experts implementation and load-balancing loss set, its routers
    frozen unless `moe.train_router` (with LoRA, peft decides what trains: `components.moe.lora_plan`),
    and its expert load and auxiliary loss added to the training records. None for a dense model."""
    from recipeforge.components import moe

    layers = moe.moe_layers(model)
    if not layers:
        return None
    m = ctx.recipe.moe
    impl = moe.configure(model, m, location=ctx.locate(("moe", "experts_implementation")))
    if ctx.recipe.adapter.type == "none":
        moe.set_router_trainable(model, m.train_router)
    load = moe.ExpertLoad(model, count_load=m.log_expert_load)
    log_sources.append(load.take)
    coef = getattr(model.config, "router_aux_loss_coef", None)
    ctx.log(f"moe: {len(layers)} MoE layers, experts run {impl}; routers "
            f"{'trained' if m.train_router else 'frozen'}; load-balancing loss "
            f"{f'on (coefficient {coef})' if m.aux_loss else 'off'}")
    return load


def fake_quantize(ctx: StageContext, model: PreTrainedModel) -> None:
    """`train.qat`: torchao's fake quantization on the linear layers the int4 export quantizes
    (`components.qat`), before the trainer wraps the model; saving swaps them back."""
    from recipeforge.components import qat

    q = ctx.recipe.train.qat
    assert q is not None
    if ctx.load_sharded is not None:
        raise RecipeError("train.qat swaps the linear layers of a whole model for torchao's fake-quantized "
                          f"ones, and the {ctx.plan.backend} backend loads this model shard by shard",
                          key="train.qat", location=ctx.locate(("train", "qat")),
                          hint="use distributed.backend: single or ddp, or drop train.qat")
    qat.check_group_size(model, q.group_size, location=ctx.locate(("train", "qat", "group_size")))
    count = qat.prepare(model, q.scheme, q.group_size)
    ctx.log(f"qat: {count} linear layers fake-quantized ({q.scheme}, groups of {q.group_size}; torchao); "
            f"final/ holds plain weights")
