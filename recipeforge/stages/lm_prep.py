"""The data of the causal-LM stages (pretrain, SFT, distillation, and plugin stages built on
`stages.lm.LMStage`): the chat template set, then the rows tokenized, masked and packed once
(`components.lm_data`, cached), or streamed (`data.streaming`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.components.prepared import PreparedData
from recipeforge.stages.context import RecipeContext, StageContext

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from recipeforge.config.schema.data import DatasetSpec


def prepare_lm(ctx: RecipeContext, tokenizer: PreTrainedTokenizerBase) -> PreparedData:
    """The training and eval sequences of `ctx`'s recipe, with `tokenizer` given its chat template."""
    from recipeforge.components.formats import get_format
    from recipeforge.components.lm_data import prepare_lm_data
    from recipeforge.components.template_check import check_run_template
    from recipeforge.components.tokenizer import set_chat_template

    data = ctx.recipe.data
    specs = list(data.datasets) + list(data.eval_datasets)
    # Rows written with a text prompt (`prompt:`) do not go through the chat template.
    conversational = any(get_format(s.format).conversational({}) and getattr(s, "prompt", None) is None
                         for s in specs)
    set_chat_template(tokenizer, data.chat_template, required=conversational,
                      location=ctx.locate(("data", "chat_template")))
    prompt_as_chat_template(ctx, tokenizer, specs)
    # Chat data: a template whose trained tokens a server would not give the model again is refused
    # before anything is tokenized (`data.template_check`).
    replies = check_run_template(tokenizer, ctx.recipe, base_dir=ctx.base_dir, locate=ctx.locate)
    if replies is not None:
        ctx.log(f"chat template: training and serving give the same tokens before each of {replies} probe replies")
    if data.streaming:
        return streamed_data(ctx, tokenizer)
    lm = prepare_lm_data(ctx.recipe, tokenizer, base_dir=ctx.base_dir, locate=ctx.locate)
    return PreparedData(train=lm.train, eval=lm.eval, stats=dict(lm.stats), packed=lm.packed,
                        unit="packed sequences" if lm.packed else "sequences",
                        fingerprint=lm.fingerprint, cache_path=lm.cache_path)


def prompt_as_chat_template(ctx: RecipeContext, tokenizer: PreTrainedTokenizerBase, specs: list[DatasetSpec]) -> None:
    """When every dataset is written with the same text prompt and the recipe names no chat template,
    the tokenizer saved with the model gets a chat template that writes that prompt, so `recipeforge
    chat` and `serve` prompt the model the way it was trained (not with the tokenizer's own template)."""
    from recipeforge.components.text_prompt import chat_template
    from recipeforge.components.tokenizer import special_prefix_ids

    prompts = {getattr(s, "prompt", None) for s in specs}
    if len(prompts) != 1 or None in prompts or ctx.recipe.data.chat_template != "tokenizer":
        return
    template = chat_template(prompts.pop(), bos=bool(special_prefix_ids(tokenizer)))
    if template is not None:
        tokenizer.chat_template = template


def streamed_data(ctx: RecipeContext, tokenizer: PreTrainedTokenizerBase) -> PreparedData:
    """`data.streaming`: this process's stream of training sequences (`components.lm_stream`), and the
    eval datasets tokenized and cached as usual. Preparing the data before a launch (or `recipeforge
    preprocess`) reads the first window only: the rows' errors show before any worker starts."""
    from recipeforge.stages.streamed_data import check_stream_layout, eval_data, probe, training_stream

    recipe = ctx.recipe
    plan = ctx.plan if isinstance(ctx, StageContext) else None  # None: data prepared alone
    training = plan is not None
    if plan is not None:
        check_stream_layout(plan.data_parallel or 1, ctx.dist.world_size, location=ctx.locate(("data", "streaming")))
    stream = training_stream(recipe, tokenizer, ctx, rank=ctx.dist.rank if training else 0,
                             world=ctx.dist.world_size if training else 1)
    evaluation = eval_data(recipe, tokenizer, ctx)
    stats = stream.stats() if training else probe(stream)
    if evaluation is not None:
        stats["eval_rows"] = len(evaluation.train)
    return PreparedData(train=stream, eval=evaluation.train if evaluation is not None else None, stats=stats,
                        packed=bool(recipe.data.packing),
                        unit="packed sequences" if recipe.data.packing else "sequences")
