"""Kahneman-Tversky Optimization on TRL's `KTOTrainer`.

KTO learns from single completions marked desirable or undesirable (the `unpaired` format); a
`preference` dataset is unpaired first (chosen: desirable, rejected: undesirable). The reference
model is handled as for DPO: with an adapter it is the base with adapters disabled, for full
fine-tuning a second copy of the starting model, or the model `kto.reference` names.

TRL estimates KTO's KL term from each row's prompt paired with a neighbour's completion in the same
micro batch, so it reads the rows in order (sequential sampling) and needs micro batches of two or
more rows; recipeforge shuffles the rows once, with `train.seed`, when `data.shuffle` is on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stages.trl_preference import PreferenceTrainerStage

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel

    from recipeforge.components.formats import Format
    from recipeforge.config.schema.data import DataConfig
    from recipeforge.config.schema.preference import KTOConfig
    from recipeforge.config.schema.stage_recipes import KTORecipe
    from recipeforge.stages.context import Locate


def unpaired_rows(ds: Dataset, fmt: Format) -> Dataset:
    """Rows of an `unpaired` dataset as they are; a preference dataset's pairs as two rows each,
    the chosen answer desirable (label true) and the rejected one undesirable, kept next to each other."""
    if fmt.kind != "preference":
        return ds
    if "prompt" not in ds.column_names:  # the prompt is the conversation both answers share
        from trl.data_utils import maybe_extract_prompt

        ds = ds.map(maybe_extract_prompt)

    def unpair(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"prompt": [], "completion": [], "label": []}
        for prompt, chosen, rejected in zip(batch["prompt"], batch["chosen"], batch["rejected"]):
            out["prompt"] += [prompt, prompt]
            out["completion"] += [chosen, rejected]
            out["label"] += [True, False]
        return out

    return ds.map(unpair, batched=True, remove_columns=ds.column_names)


def check_labels(rows: Dataset, data: DataConfig, locate: Locate) -> None:
    """KTO needs desirable and undesirable completions among the training rows."""
    labels = set(rows["label"])
    if len(labels) > 1:
        return
    kind = "desirable (label true)" if True in labels else "undesirable (label false)"
    missing = "false" if True in labels else "true"
    one = len(data.datasets) == 1
    raise RecipeError(f"KTO needs desirable and undesirable completions, but every training row is {kind}",
                      key="data.datasets[0]" if one else "data.datasets",
                      location=locate(("data", "datasets", 0, "path") if one else ("data", "datasets")),
                      hint=f"add rows with label {missing}, or train on preference pairs (format: preference), "
                           f"whose rejected answers become undesirable rows")


class KTOStage(PreferenceTrainerStage):
    """KTO on prompt/completion/label rows (or unpaired preference pairs)."""

    stage = "kto"
    method = "KTO"
    trainer_class = "trl.KTOTrainer"
    recipe: KTORecipe

    @property
    def section(self) -> KTOConfig:
        return self.recipe.kto

    def prepare_data(self) -> PreparedData:
        from recipeforge.stages.rows import prepare_rows

        data, seed = self.recipe.data, self.recipe.train.seed

        def finish(train: Dataset, stats: dict[str, Any]) -> Dataset:
            check_labels(train, data, self.ctx.locate)
            stats["desirable_rows"] = sum(train["label"])
            stats["undesirable_rows"] = len(train) - stats["desirable_rows"]
            # The trainer samples in order (see the module docstring): shuffled once here.
            return train.shuffle(seed=seed) if data.shuffle else train

        return prepare_rows(self.ctx, self.tokenizer, ("unpaired", "preference"),
                            max_prompt_length=self.section.max_prompt_length, reshape=unpaired_rows, finish=finish)

    def method_arguments(self) -> dict[str, Any]:
        k = self.section
        return {"beta": k.beta, "desirable_weight": k.desirable_weight, "undesirable_weight": k.undesirable_weight,
                "train_sampling_strategy": "sequential"}

    def trainer_arguments(self) -> dict[str, Any]:
        return {"ref_model": self.reference_model()}

    def reference_model(self) -> PreTrainedModel | None:
        """The frozen reference model (`TrainerStage.frozen_reference` of `kto.reference`)."""
        return self.frozen_reference(self.section.reference)
