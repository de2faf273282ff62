"""`data:` — datasets, their format, tokenization and packing."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from recipeforge.config.schema.base import Section


class MessageFields(Section):
    """How the messages of a chat dataset are laid out when they are not OpenAI/ShareGPT style."""

    field: str = Field("messages", min_length=1, description="Column holding the list of messages.")
    role: Optional[str] = Field(
        None, min_length=1, description="Key of a message that holds its role (default: `role`, or ShareGPT `from`).")
    content: Optional[str] = Field(
        None, min_length=1,
        description="Key of a message that holds its text (default: `content`, or ShareGPT `value`).")
    roles: dict[Literal["system", "user", "assistant", "tool"], tuple[str, ...]] = Field(
        default_factory=dict,
        description="Source role names for each role, e.g. {user: [human, customer], assistant: [gpt, agent]}; "
                    "added to the standard names (user/human, assistant/gpt/bot/model, system, tool).")
    system_field: Optional[str] = Field(
        None, min_length=1,
        description="Column with a system prompt for each row; put first in the conversation when it is not empty "
                    "and the conversation has no system message.")
    system_prompt: Optional[str] = Field(
        None, min_length=1, description="System prompt for rows that have none (neither a system message nor a "
                                        "value in `system_field`).")
    train_field: Optional[str] = Field(
        None, min_length=1,
        description="Key of a message that says (true/false) whether an assistant reply is trained; replies "
                    "without it are trained.")

    @field_validator("roles")
    @classmethod
    def _distinct_sources(cls, value: dict) -> dict:
        seen: dict[str, str] = {}
        for role, names in value.items():
            for n in names:
                if seen.get(n, role) != role:
                    raise ValueError(f"'{n}' is listed under both {seen[n]} and {role}")
                seen[n] = role
        return value


class TextPrompt(Section):
    """An instruction prompt written as text, as Axolotl's alpaca-style prompters write it: the system text,
    then the turn (with or without an input), then the reply and EOS. Placeholders such as
    ``{instruction}`` name columns of the row (after `columns:`); ``{system}`` is the system text."""

    turn: str = Field(
        min_length=1,
        description="The turn of a row with a non-empty `input`, e.g. \"### Instruction:\\n{instruction}\\n\\n### "
                    "Input:\\n{input}\\n\\n### Response:\\n\" (Python format string: {column}; {{ for a brace).")
    turn_no_input: str = Field(
        min_length=1, description="The turn of a row without an input, e.g. \"### Instruction:\\n{instruction}\\n\\n"
                                  "### Response:\\n\".")
    system: Optional[str] = Field(
        None, description="System text of rows with an input (and of all rows when `system_no_input` is not set); "
                          "none or empty: no system text.")
    system_no_input: Optional[str] = Field(
        None, description="System text of rows without an input (default: `system`; empty: none).")
    system_format: str = Field(
        "{system}", description="How a non-empty system text is written before the turn, e.g. \"{system}\\n\\n\".")
    row_system: bool = Field(
        False, description="Take the system text from the row's `system` column when it is not empty.")
    output_format: str = Field(
        "{output}", min_length=1,
        description="The reply (trained, followed by EOS), e.g. \"what is {answer}\". Default: the `output` column.")

    @model_validator(mode="after")
    def _placeholders(self):
        from recipeforge.components.text_prompt import placeholders

        for name in ("turn", "turn_no_input", "system_format", "output_format"):
            try:
                placeholders(getattr(self, name))
            except ValueError as exc:
                raise PydanticCustomError("prompt_template", "{name}: {why}", {"name": name, "why": str(exc)})
        if "system" in placeholders(self.output_format):
            raise PydanticCustomError("prompt_template", "output_format cannot read {{system}}", {})
        return self


class RowTexts(Section):
    """Preference and unpaired rows written as text with format strings, as Axolotl's DPO and KTO types do.

    Each text is a format string over the row's columns (after `columns:`), and the trainer gets the texts,
    not messages, so the chat template is not applied (TRL tokenizes them as any text: the tokenizer's BOS
    before the prompt, EOS after an answer that does not end with it). ``{chosen[1][content]}`` reads into a
    column holding a list of messages."""

    prompt: str = Field(
        "{prompt}", min_length=1,
        description="The prompt, e.g. \"<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n\" "
                    "(Python format string: {column}, {column[0][content]}; {{ for a brace).")
    system: Optional[str] = Field(
        None, min_length=1,
        description="Written before the prompt when the row's `system` column is not empty, e.g. "
                    "\"<|im_start|>system\\n{system}<|im_end|>\\n\". Default: nothing (a {system} in `prompt` "
                    "reads the column, empty where it is missing).")
    chosen: str = Field("{chosen}", min_length=1,
                        description="Format `preference`: the chosen answer, e.g. \"{chosen}<|im_end|>\".")
    rejected: str = Field("{rejected}", min_length=1,
                          description="Format `preference`: the rejected answer, e.g. \"{rejected}<|im_end|>\".")
    completion: str = Field("{completion}", min_length=1,
                            description="Format `unpaired`: the completion, e.g. \"{completion}<|im_end|>\".")

    @field_validator("prompt", "system", "chosen", "rejected", "completion")
    @classmethod
    def _placeholders(cls, template: Optional[str]) -> Optional[str]:
        """Each placeholder names a column, indexed at most: checked at the text's own line."""
        from recipeforge.components.row_texts import columns_read

        try:
            columns_read(template or "")
        except ValueError as exc:
            raise PydanticCustomError("texts_template", "{why}", {"why": str(exc)}) from None
        return template


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
    messages: Optional[MessageFields] = Field(
        None, description="Format `messages`: where the messages, their roles and texts are (field mappings).")
    dedup: Optional[bool] = Field(
        None, description="Drop rows identical to an earlier row of this dataset (default: `data.dedup`).")
    images: Optional[str] = Field(
        None, min_length=1,
        description="Vision-language models: the column holding each row's image paths (a list, or one path) for "
                    "rows that mark where images go with `<image>` placeholders in their texts (LLaVA / ShareGPT "
                    "layout). Default: `images` when the rows have it, else `image`. A row with images but no "
                    "placeholder gets them at the start of its first user turn. Rows whose message content lists "
                    "name their images (`{type: image, image: path}`) need no column.")
    image_root: Optional[str] = Field(
        None, min_length=1,
        description="Vision-language models: the folder relative image paths start at (itself relative to the "
                    "recipe file). Default: the dataset file's folder.")
    prompt: Optional[TextPrompt] = Field(
        None,
        description="Format `alpaca`: write each row with this instruction prompt (text, not the chat template), "
                    "as Axolotl's alpaca-style prompters do: the prompt untrained, the reply and EOS trained. "
                    "`recipeforge convert axolotl` writes Axolotl's own prompt here.")
    texts: Optional[RowTexts] = Field(
        None,
        description="Formats `preference` and `unpaired`: write each row's prompt and answers as text with these "
                    "format strings (not the chat template), as Axolotl's DPO and KTO types do. `recipeforge convert "
                    "axolotl` writes Axolotl's own texts here.")
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

    @model_validator(mode="after")
    def _images_need_a_chat_format(self):
        # Images go into chat turns (SFT) or the prompt (preference); other layouts have nowhere to put them.
        for name in ("images", "image_root"):
            if getattr(self, name) is not None and self.format not in ("messages", "preference"):
                raise PydanticCustomError("images_format", "`{name}` needs format: messages or preference (got "
                                          "format: {format})", {"name": name, "format": self.format})
        return self

    @model_validator(mode="after")
    def _prompt_needs_the_alpaca_format(self):
        if self.prompt is not None and self.format != "alpaca":
            raise PydanticCustomError("prompt_format", "`prompt` needs format: alpaca (got format: {format})",
                                      {"format": self.format})
        return self

    @model_validator(mode="after")
    def _texts_need_a_preference_format(self):
        if self.texts is None:
            return self
        if self.format not in ("preference", "unpaired"):
            raise PydanticCustomError("texts_format", "`texts` needs format: preference or unpaired (got format: "
                                      "{format})", {"format": self.format})
        other = ("completion",) if self.format == "preference" else ("chosen", "rejected")
        wrong = [n for n in other if n in self.texts.model_fields_set]
        if wrong:
            raise PydanticCustomError("texts_format", "texts.{name} is not a text of format {format}",
                                      {"name": wrong[0], "format": self.format})
        return self

    @model_validator(mode="after")
    def _messages_need_the_messages_format(self):
        if self.messages is not None and self.format != "messages":
            raise PydanticCustomError("messages_format", "`messages` field mappings need format: messages (got "
                                      "format: {format})", {"format": self.format})
        return self


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
        description="Chat template for `messages`/`alpaca`: `tokenizer` (the tokenizer's own), a named one (chatml, "
                    "llama3, llama4, qwen2.5, qwen3, gemma3, mistral_v3, mistral_v3_tekken, phi3, deepseek_v3, "
                    "zephyr), or a path to a .jinja file (relative to the recipe file). Loss is on the assistant "
                    "replies and their turn-end token.")
    template_check: bool = Field(
        True, description="Chat data (`messages`, `alpaca`): before step 0, `train` checks that the tokens it trains on "
                          "before each assistant reply equal what a server (vLLM, `recipeforge serve`) gives the model "
                          "from the run's saved tokenizer, and refuses naming the first differing token (the check "
                          "`recipeforge check-template` runs; tokenizer only). `false` skips it.")
    dedup: bool = Field(
        False, description="Drop training rows identical to an earlier one (across all training datasets; a "
                           "dataset's own `dedup` overrides this for it). The count is in the data log line.")
    train_on_inputs: bool = Field(
        False, description="SFT: also train on prompt/user tokens. Default: only assistant/completion tokens.")
    truncation: Literal["truncate", "drop"] = Field(
        "truncate", description="Samples longer than `sequence_len`: cut them, or drop them (counted in the log).")
    shuffle: bool = Field(True, description="Shuffle training rows (with `train.seed`).")
    num_proc: Union[Annotated[int, Field(ge=1)], Literal["auto"]] = Field(
        1, description="Processes that tokenize the rows (forked workers, a chunk of rows each; the result is the "
                       "same). `auto`: one per CPU core this process may use, at most 8 (2 on a 2-core machine); "
                       "resolved to that number when the recipe is loaded. Datasets under 1,000 rows per process "
                       "use fewer. With 1, the tokenizer still uses every core for its own part.")
    cache_dir: Optional[str] = Field(None, description="Where tokenized data is cached (default: ~/.cache/recipeforge).")
    streaming: bool = Field(
        False,
        description="Pretrain/SFT: read the training datasets as streams (local files, folders or glob patterns of "
                    "shards, hub datasets, object stores) and tokenize and pack them while training runs, a window "
                    "at a time; nothing is cached, so a corpus larger than the disk trains. Each process reads its "
                    "own share; checkpoints keep every process's position, and a resume goes on from there (no row "
                    "trained twice, none skipped). Needs `train.max_steps` (the stream starts over when it runs "
                    "out); evaluation data comes from `eval_datasets` (tokenized and cached as usual).")
    stream_window: int = Field(
        8192, gt=0, le=10_000_000,
        description="`streaming`: rows read, tokenized, packed and shuffled together. Larger windows pack tighter and "
                    "shuffle wider, and hold more tokens in memory; a corpus within one window gives exactly the "
                    "cached path's sequences.")
    stream_log: bool = Field(
        False,
        description="`streaming`: write which rows each optimizer step trained on to "
                    "RUN/data_order/rank-<r>.jsonl, one line per batch: {\"step\": N, \"rows\": [[dataset, row], "
                    "...]} (dataset: its index in `datasets`; row: 1-based in its source), e.g. to find the "
                    "documents behind a loss spike.")

    @field_validator("num_proc")
    @classmethod
    def _resolve_auto(cls, value):
        # Resolved here so that every consumer (and the resolved recipe) sees a number.
        if value == "auto":
            from recipeforge.components.lm_encode import auto_processes

            return auto_processes()
        return value
