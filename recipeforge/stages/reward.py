"""Bradley-Terry reward models on TRL's `RewardTrainer`.

The model is the recipe's base with a one-output sequence-classification head (`score`) in place of
the LM head; the loss is -log sigmoid(r_chosen - r_rejected [- margin]). Pairs come from the
`preference` format (prompt/chosen/rejected, plain text or chat messages; an optional numeric
`margin` column adds TRL's margin term). recipeforge tokenizes the pairs itself, as TRL would
(prompt + answer, EOS appended to plain text, the chat template for messages), so that every row
problem names its dataset and row, and `data.sequence_len` / `data.truncation` decide what happens
to long pairs instead of TRL's silent filter. With LoRA the head is trained in full next to the
adapters (peft `modules_to_save`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PreTrainedTokenizerBase, Trainer

    from recipeforge.components.formats import Format
    from recipeforge.config.schema.stage_recipes import RewardRecipe

HEAD = "score"  # the head of transformers' *ForSequenceClassification models
PAIR_COLUMNS = ("chosen_ids", "rejected_ids", "margin")  # what the trainer reads (RewardTrainer's signature)


class RewardStage(TrainerStage):
    """A reward model trained on chosen/rejected pairs."""

    stage = "reward"
    trainer_class = "trl.RewardTrainer"
    num_labels = 1  # one score per sequence
    recipe: RewardRecipe

    def prepare_data(self) -> PreparedData:
        from recipeforge.components.data import format_rows, load_split
        from recipeforge.components.formats import RenderOptions
        from recipeforge.components.tokenizer import set_chat_template

        data = self.recipe.data
        where = self.ctx.locate(("data", "chat_template"))
        set_chat_template(self.tokenizer, data.chat_template, required=False, location=where)
        opts = RenderOptions(self.tokenizer)
        counts = {"pairs_truncated": 0, "pairs_dropped": 0}
        margins: list[bool] = []  # per dataset read: whether it has a margin column

        def transform(ds: Dataset, fmt: Format) -> Dataset:
            check_pair_rows(ds)
            margins.append("margin" in ds.column_names)
            rows = format_rows(ds, opts)
            if not getattr(self.tokenizer, "chat_template", None) and _conversational(rows):
                set_chat_template(self.tokenizer, data.chat_template, required=True, location=where)
            rows, cut, dropped = tokenize_pairs(rows, self.tokenizer, max_length=data.sequence_len,
                                                truncation=data.truncation)
            counts["pairs_truncated"] += cut
            counts["pairs_dropped"] += dropped
            return rows

        train, evaluation, stats = load_split(data, ("preference",), seed=self.recipe.train.seed,
                                              base_dir=self.ctx.base_dir, transform=transform, locate=self.ctx.locate)
        # Datasets are read in order, training ones first; mixing with and without margins would leave
        # pairs whose margin is missing.
        n = len(data.datasets)
        for section, flags in (("datasets", margins[:n]), ("eval_datasets", margins[n:])):
            if any(flags) and not all(flags):
                raise RecipeError(f"some of data.{section} have a margin column and others do not; the margin "
                                  f"term applies to every pair or to none", key=f"data.{section}",
                                  location=self.ctx.locate(("data", section)),
                                  hint="give every dataset a margin column (columns: {margin: <your column>}), "
                                       "or none")
        stats.update({k: v for k, v in counts.items() if v})
        if "margin" in train.column_names:
            stats["margin"] = "from the data"
        return PreparedData(train=train, eval=evaluation, stats=stats)

    def peft_config(self) -> LoraConfig | None:
        """LoRA for sequence classification, with the score head trained in full (it starts random)."""
        from recipeforge.components.adapters import lora_config

        a = self.recipe.adapter
        if a.type == "none":
            return None
        config = lora_config(a, task_type="SEQ_CLS")
        config.modules_to_save = list(dict.fromkeys([*(config.modules_to_save or []), HEAD]))
        return config

    def build_trainer(self) -> Trainer:
        from recipeforge.outputs.atomic import crash_safe
        from recipeforge.stages.trl_lengths import length_arguments
        from trl import RewardConfig, RewardTrainer

        rw = self.recipe.reward
        # Pairs were cut or dropped to data.sequence_len while tokenizing; TRL's own filter stays off.
        lengths = length_arguments(RewardConfig, max_length=None)
        args = self.training_arguments(
            RewardConfig, center_rewards_coefficient=rw.center_rewards_coefficient,
            disable_dropout=rw.disable_dropout, **lengths)
        trainer = crash_safe(RewardTrainer)(model=self.model, args=args, train_dataset=self.train_rows,
                                            eval_dataset=self.eval_rows, processing_class=self.tokenizer,
                                            peft_config=self.peft_config(), callbacks=self.callbacks())
        if self.recipe.adapter.type == "qlora":
            # TRL casts every trainable weight of a quantized model to bf16. The score head trained in
            # full is a plain Linear, which then meets the fp32 hidden states of peft's k-bit
            # preparation; outside autocast (CPU runs) that fails. It is hidden_size weights: keep fp32.
            for name, param in trainer.model.named_parameters():
                if param.requires_grad and f"{HEAD}.modules_to_save" in name:
                    param.data = param.data.float()
        return trainer


# ----------------------------------------------------------------------------- rows

def _is_messages(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _kind(value: object) -> str:
    if isinstance(value, list):
        inner = sorted({type(v).__name__ for v in value})
        return f"a list of {', '.join(inner)}" if inner else "an empty list"
    return type(value).__name__


def check_pair_rows(ds: Dataset) -> None:
    """Fail on the first row whose prompt/chosen/rejected is neither text nor chat messages, or
    whose margin is not a finite number. `ds` still has its ``_row`` column (1-based row numbers in
    the source), so the error names the row; `load_split` adds the dataset and its file."""
    rows = ds["_row"]
    for column in ("prompt", "chosen", "rejected"):
        if column not in ds.column_names:
            continue
        for row, value in zip(rows, ds[column]):
            if value is None or value == "" or value == []:
                raise RecipeError(f"row {row}: column '{column}' is empty",
                                  hint="every pair needs a chosen and a rejected answer (and a prompt when the "
                                       "column exists)")
            if not (isinstance(value, str) or _is_messages(value)):
                raise RecipeError(f"row {row}: column '{column}' must be text or a list of chat messages "
                                  f"({{role, content}}), not {_kind(value)}")
    if "margin" in ds.column_names:
        for row, value in zip(rows, ds["margin"]):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RecipeError(f"row {row}: column 'margin' must be a finite number, not {value!r}",
                                  hint="margin is how much better the chosen answer is (0 for no margin)")


def _conversational(rows: Dataset) -> bool:
    first = rows[0] if len(rows) else {}
    return any(_is_messages(first.get(c)) for c in ("prompt", "chosen"))


def tokenize_pairs(rows: Dataset, tokenizer: PreTrainedTokenizerBase, *, max_length: int,
                   truncation: str) -> tuple[Dataset, int, int]:
    """Token ids of each chosen and rejected sequence (prompt + answer), as TRL's RewardTrainer
    tokenizes them: the chat template for messages, else the text with EOS appended. Sequences longer
    than `max_length` are cut to it (`truncation: truncate`) or their pair dropped (`drop`).
    Returns (rows with chosen_ids, rejected_ids [, margin]; pairs cut; pairs dropped)."""
    import datasets

    eos = tokenizer.eos_token or ""
    cut = dropped = 0

    def ids(prompt: Any, answer: Any) -> list[int]:  # text, or chat messages (a prompt may be None)
        if _is_messages(answer):
            return list(tokenizer.apply_chat_template((prompt or []) + answer, tokenize=True,
                                                      return_dict=True)["input_ids"])
        text = (prompt or "") + answer
        encoded: list[int] = tokenizer(text if text.endswith(eos) else text + eos)["input_ids"]
        return encoded

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        nonlocal cut, dropped
        out: dict[str, list[Any]] = {"chosen_ids": [], "rejected_ids": [], "keep": []}
        prompts = batch.get("prompt") or [None] * len(batch["chosen"])
        for prompt, chosen, rejected in zip(prompts, batch["chosen"], batch["rejected"]):
            c, r = ids(prompt, chosen), ids(prompt, rejected)
            long = len(c) > max_length or len(r) > max_length
            if long and truncation == "drop":
                dropped += 1
            elif long:
                cut += 1
                c, r = c[:max_length], r[:max_length]
            out["chosen_ids"].append(c)
            out["rejected_ids"].append(r)
            out["keep"].append(not (long and truncation == "drop"))
        return out

    datasets.disable_progress_bars()
    try:
        drop = [c for c in rows.column_names if c not in PAIR_COLUMNS]
        out = rows.map(encode, batched=True, remove_columns=drop, load_from_cache_file=False)
        if dropped:
            out = out.filter(lambda keep: keep, input_columns="keep")
        out = out.remove_columns("keep")
    finally:
        datasets.enable_progress_bars()
    return out, cut, dropped
