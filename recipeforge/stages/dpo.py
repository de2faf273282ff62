"""Direct Preference Optimization on TRL's `DPOTrainer`.

The reference model is handled as TRL does: with an adapter it is the base with adapters disabled
(no second copy in memory); for full fine-tuning it is a second copy of the starting model, or the
model `dpo.reference` names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.stage_specs import Stage
from recipeforge.stages.base import TrainerStage
from recipeforge.stages.vision import VisionStage, distinct_rows

if TYPE_CHECKING:
    from transformers import BatchFeature, PreTrainedModel, Trainer

    from recipeforge.config.schema.stage_recipes import DPORecipe
    from recipeforge.stages.context import RecipeContext

# TRL's name for the NLL term on chosen answers among DPOConfig.loss_type values
TRL_NLL_LOSS = "sft"


def dpo_arguments(recipe: DPORecipe, config_cls: type) -> dict[str, Any]:
    """The DPOConfig fields of the `dpo:` section: beta, the loss (with RPO's NLL term), lengths."""
    from recipeforge.stages.trl_lengths import length_arguments

    d = recipe.dpo
    losses: list[str] = [d.loss_type]
    weights: list[float] | None = None
    if d.rpo_alpha:
        # RPO: the preference loss plus an NLL term on chosen answers, weighted by rpo_alpha.
        losses, weights = [d.loss_type, TRL_NLL_LOSS], [1.0, d.rpo_alpha]
    # Every length limit the installed TRL has comes from the recipe: prompts are cut only by
    # dpo.max_prompt_length (recipeforge cuts them itself, in prepare_data), whole pairs by
    # data.sequence_len; a TRL default never applies.
    lengths = length_arguments(config_cls, max_length=recipe.data.sequence_len,
                               max_prompt_length=d.max_prompt_length, max_completion_length=None)
    num_proc = recipe.data.num_proc  # a number once the recipe is loaded (`auto` is resolved then)
    return dict(beta=d.beta, loss_type=losses, loss_weights=weights, label_smoothing=d.label_smoothing, **lengths,
                disable_dropout=True,
                dataset_num_proc=num_proc if isinstance(num_proc, int) and num_proc > 1 else None)


class DPOStage(TrainerStage):
    """DPO on prompt/chosen/rejected rows (a vision-language model's: `VisionDPOStage`)."""

    stage = "dpo"
    trainer_class = "trl.DPOTrainer"
    recipe: DPORecipe

    # A `VisionDPOStage` is no DPOStage: the runner made is a TrainerStage.
    def __new__(cls, ctx: RecipeContext, *args: Any, **kwargs: Any) -> TrainerStage:  # type: ignore[misc]
        from recipeforge.stages.vision_check import is_vision_recipe

        if cls is DPOStage and is_vision_recipe(ctx.recipe):
            return VisionDPOStage(ctx)
        return super().__new__(cls)

    def prepare_data(self) -> PreparedData:
        return self.prepare_rows("preference", max_prompt_length=self.recipe.dpo.max_prompt_length)

    def reference_model(self) -> PreTrainedModel | None:
        """The frozen reference model (`TrainerStage.frozen_reference` of `dpo.reference`)."""
        return self.frozen_reference(self.recipe.dpo.reference)

    def build_trainer(self) -> Trainer:
        from recipeforge.outputs.atomic import crash_safe
        from trl import DPOConfig, DPOTrainer

        args = self.training_arguments(DPOConfig, **dpo_arguments(self.recipe, DPOConfig))
        return crash_safe(DPOTrainer)(model=self.model, ref_model=self.reference_model(), args=args,
                          train_dataset=self.train_rows, eval_dataset=self.eval_rows,
                          processing_class=self.tokenizer, peft_config=self.peft_config(),
                          callbacks=self.callbacks())


class VisionDPOStage(VisionStage):
    """DPO of a VLM on TRL's `DPOTrainer`: the images belong to the prompt."""

    stage = Stage.DPO
    trainer_class = "trl.DPOTrainer"
    recipe: DPORecipe

    def reference_model(self) -> PreTrainedModel | None:
        return self.frozen_reference(self.recipe.dpo.reference)

    def build_trainer(self) -> Trainer:
        from trl import DPOConfig, DPOTrainer

        from recipeforge.outputs.atomic import crash_safe

        args = self.training_arguments(DPOConfig, **dpo_arguments(self.recipe, DPOConfig),
                                       remove_unused_columns=False)
        return crash_safe(DPOTrainer)(model=self.model, ref_model=self.reference_model(), args=args,
                                      train_dataset=self.train_rows, eval_dataset=self.eval_rows,
                                      processing_class=self.processor, peft_config=self.peft_config(),
                                      callbacks=self.callbacks())

    def check_images(self) -> None:
        from recipeforge.components.vision_model import check_image_tokens

        from trl.data_utils import prepare_multimodal_messages

        def collate(rows: list[dict[str, Any]]) -> BatchFeature:
            # The prompt with its images, as DPO's collator encodes it (the answers hold no image).
            row = rows[0]
            messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
            return self.processor.apply_chat_template([messages], tokenize=True, return_dict=True,
                                                      return_tensors="pt", add_generation_prompt=True)

        check_image_tokens(collate, distinct_rows(self.train_rows), self.trainer.model.config,
                           self.processor.tokenizer.convert_tokens_to_ids(self.processor.image_token), None)
