"""Rows for the TRL trainers that tokenize themselves (DPO, ORPO, CPO, KTO, GRPO): read, rendered,
checked, with prompts cut to the stage's limit, as one `components.prepared.PreparedData`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from recipeforge.components.prepared import PreparedData

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from recipeforge.components.formats import Format
    from recipeforge.stages.context import RecipeContext

# (train rows, statistics) -> train rows: a stage's own step on the training rows after they are
# read (KTO: check the labels, count them, shuffle); it may add statistics.
RowsStep = Callable[["Dataset", dict[str, Any]], "Dataset"]


def prepare_rows(ctx: RecipeContext, tokenizer: PreTrainedTokenizerBase, kinds: Sequence[str], *,
                 max_prompt_length: int | None, reshape: Callable[[Dataset, Format], Dataset] | None = None,
                 finish: RowsStep | None = None, unit: str = "rows") -> PreparedData:
    """The training and eval rows of formats of `kinds`, rendered by their format
    (`components.data.format_rows`) and `reshape`d (rendered rows, format -> rows), then `finish`, then prompts cut to
    `max_prompt_length` tokens. A conversational prompt needs a chat template (set from the recipe or
    the tokenizer's own)."""
    from recipeforge.components.data import format_rows, load_split, truncate_prompts
    from recipeforge.components.formats import RenderOptions
    from recipeforge.components.tokenizer import set_chat_template

    data, where = ctx.recipe.data, ctx.locate(("data", "chat_template"))
    set_chat_template(tokenizer, data.chat_template, required=False, location=where)
    opts = RenderOptions(tokenizer)

    def render(ds: Dataset, fmt: Format) -> Dataset:
        rows = format_rows(ds, opts)
        return reshape(rows, fmt) if reshape is not None else rows

    train, evaluation, stats = load_split(data, tuple(kinds), seed=ctx.recipe.train.seed, base_dir=ctx.base_dir,
                                          transform=render, locate=ctx.locate)
    if finish is not None:
        train = finish(train, stats)
    if max_prompt_length:
        train, stats["prompts_truncated"] = truncate_prompts(train, tokenizer, max_prompt_length)
        if evaluation is not None:
            evaluation, _ = truncate_prompts(evaluation, tokenizer, max_prompt_length)
    conversational = "prompt" in train.column_names and isinstance(train[0]["prompt"], list)
    if conversational and not getattr(tokenizer, "chat_template", None):
        set_chat_template(tokenizer, data.chat_template, required=True, location=where)
    return PreparedData(train=train, eval=evaluation, stats=stats, unit=unit)
