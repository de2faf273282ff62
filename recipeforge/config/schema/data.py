"""`data:` — datasets, their format, tokenization and packing."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from recipeforge.config.schema.base import Section


class DatasetSpec(Section):
    """One dataset: a local file/directory or a hub id, its format and column names."""

    path: str = Field(min_length=1, description="Local file (.jsonl/.json/.parquet/.csv/.txt), directory, or hub id.")
    format: str = Field(
        min_length=1,
        description="Row layout, from the formats registry: text | alpaca | messages | completion | preference | "
                    "prompt, or a plugin's (see `recipeforge plugins`). Which stage takes which: see the rules.")
    split: str = Field("train", description="Split to read (hub datasets, or directories with splits).")
    name: Optional[str] = Field(None, description="Hub dataset configuration (subset) name.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Rename source columns to the format's names, e.g. {prompt: question, completion: answer}.")
    max_samples: Optional[int] = Field(None, gt=0, description="Use at most this many rows (after shuffling).")
    weight: Optional[float] = Field(
        None, gt=0,
        description="Relative sampling weight when mixing several datasets: each training row is drawn from "
                    "dataset i with probability weight_i / (sum of the weights); a dataset without a weight "
                    "counts 1. Without any weight, every row of every dataset is used once per epoch (shares "
                    "follow the datasets' sizes). Weights share out rows (samples), not tokens. With a single "
                    "dataset the weight has no effect. How long an epoch is: see `data.mix_stopping`.")

    @field_validator("format")
    @classmethod
    def _registered(cls, value: str) -> str:
        # Names only: a plugin format is listed from its entry point, not imported (the stage rule
        # imports the one a recipe names). Reported like a closed choice, with did-you-mean.
        from recipeforge.components.formats import formats

        if not formats.has(value):
            names = formats.names()
            expected = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}" if len(names) > 1 else repr(names[0])
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value


class DataConfig(Section):
    """Training/evaluation data and how it becomes token sequences."""

    datasets: tuple[DatasetSpec, ...] = Field(min_length=1, description="Training datasets (at least one).")
    eval_datasets: tuple[DatasetSpec, ...] = Field((), description="Separate evaluation datasets.")
    mix_stopping: Literal["all_exhausted", "first_exhausted"] = Field(
        "all_exhausted",
        description="When datasets are mixed by weight, what one epoch is. `all_exhausted`: rows are drawn "
                    "until every row of every dataset was drawn at least once (a dataset that runs out starts "
                    "over, so small datasets with a high weight repeat). `first_exhausted`: rows are drawn "
                    "until one dataset runs out (the other datasets are used in part, and the same rows are "
                    "used every epoch). The mix is drawn once, with `train.seed`; evaluation data is not mixed.")
    val_size: Union[float, int] = Field(
        0.0, ge=0, description="Hold out this share (0 < x < 1) or this many rows of the training data for eval.")
    sequence_len: int = Field(2048, gt=0, le=1_048_576, description="Maximum tokens per training sequence.")
    packing: Optional[bool] = Field(
        None, description="Pack several samples into each sequence (no cross-attention between them). "
                          "Default: true for pretrain, false otherwise.")
    chat_template: str = Field(
        "tokenizer", min_length=1,
        description="Chat template for `messages`/`alpaca`: `tokenizer` (the tokenizer's own) or a named one "
                    "(chatml, llama3, ...).")
    train_on_inputs: bool = Field(
        False, description="SFT: also train on prompt/user tokens. Default: only assistant/completion tokens.")
    truncation: Literal["truncate", "drop"] = Field(
        "truncate", description="Samples longer than `sequence_len`: cut them, or drop them (counted in the log).")
    shuffle: bool = Field(True, description="Shuffle training rows (with `train.seed`).")
    num_proc: int = Field(1, ge=1, description="Processes for tokenization.")
    cache_dir: Optional[str] = Field(None, description="Where tokenized data is cached (default: ~/.cache/recipeforge).")
