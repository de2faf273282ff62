"""The data of a streamed pretrain/SFT run (``data.streaming``), built from a recipe: the training stream of
one process, the eval datasets (cached as usual), and the check of the first window that runs before a
launch and in `recipeforge preprocess`."""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from recipeforge.components.lm_data import LMData
    from recipeforge.components.lm_stream import StreamedLM
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.stages.context import RecipeContext

PROBE_ROWS = 1024  # rows the check before a launch reads: enough to meet the rows' problems early, and quick


def check_stream_layout(data_parallel: int, world_size: int, *, location: Location | None) -> None:
    """Refuse a stream on a plan whose processes are not all data-parallel (each reads its own share)."""
    if data_parallel != world_size:
        raise RecipeError(f"each process reads its own share of a stream, and this plan has {world_size} processes "
                          f"in {data_parallel} data-parallel groups (tensor, context or pipeline parallel ranks share "
                          "their rows)", key="data.streaming", location=location,
                          hint="stream with data parallelism alone (ddp, deepspeed, fsdp), or set data.streaming: "
                               "false")


def training_stream(recipe: Recipe, tokenizer: PreTrainedTokenizerBase, ctx: RecipeContext, *, rank: int,
                    world: int) -> StreamedLM:
    """Process `rank` of `world`'s `StreamedLM` for `recipe`."""
    from recipeforge.components.data import effective_format
    from recipeforge.components.lm_encode import EncodeOptions
    from recipeforge.components.lm_stream import StreamedLM, open_stream
    from recipeforge.stage_specs import stage_spec

    data, spec = recipe.data, stage_spec(recipe.stage)
    # As the cached path (`lm_data`): SFT masks the prompts; pretraining keeps all of a long document.
    options = EncodeOptions(train_on_inputs=data.train_on_inputs or not spec.masks_inputs,
                            sequence_len=data.sequence_len, truncation=data.truncation,
                            split_long=spec.splits_long_rows,
                            eot_tokens=tuple(getattr(recipe.model, "eot_tokens", ())))
    open_rows = partial(open_stream, data, base_dir=ctx.base_dir, locate=ctx.locate, seed=recipe.train.seed,
                        rank=rank, world=world)
    open_rows()  # opened once here: a path, column or format problem is said before training starts
    return StreamedLM(open_rows, [effective_format(s) for s in data.datasets], tokenizer, options,
                      packing=bool(data.packing), window_rows=data.stream_window, shuffle=data.shuffle,
                      seed=recipe.train.seed)


def eval_data(recipe: Recipe, tokenizer: PreTrainedTokenizerBase, ctx: RecipeContext) -> LMData | None:
    """The tokenized (cached) `data.eval_datasets` of a streamed recipe as an `LMData` whose `train`
    is the eval set, or None without eval datasets."""
    from recipeforge.components.lm_data import prepare_lm_data

    data = recipe.data
    if not data.eval_datasets:
        return None
    as_training = recipe.model_copy(update={"data": data.model_copy(update={
        "datasets": data.eval_datasets, "eval_datasets": (), "streaming": False})})

    def locate(path: tuple[Any, ...]) -> Location | None:  # the eval datasets' own lines in the recipe
        if path[:2] == ("data", "datasets"):
            path = ("data", "eval_datasets") + path[2:]
        return ctx.locate(path)

    return prepare_lm_data(as_training, tokenizer, base_dir=ctx.base_dir, locate=locate)


def probe(stream: StreamedLM) -> dict[str, Any]:
    """Tokenize and pack the first rows of `stream` (at most `PROBE_ROWS`): the statistics a streamed
    recipe can give before training, and its row errors before any worker starts."""
    import itertools

    start = time.perf_counter()
    rows = list(itertools.islice(iter(stream.open_rows()), min(PROBE_ROWS, stream.window_rows)))
    sequences = stream.window_sequences(rows, 0, 0)
    seconds = time.perf_counter() - start
    tokens = sum(len(s["input_ids"]) for s in sequences)
    stats = {**stream.stats(), "probe_sequences": len(sequences), "probe_tokens": tokens,
             "probe_tokens_per_second": round(tokens / max(seconds, 1e-9))}
    if stream.packing and sequences:
        stats["probe_packing_efficiency"] = round(tokens / (len(sequences) * stream.options.sequence_len), 4)
    stream.counts = type(stream.counts)()  # the probe's rows are counted again when training reads them
    return stats
