"""Direct Preference Optimization on TRL's `DPOTrainer`.

The reference model is handled as TRL does: with an adapter it is the base with adapters disabled
(no second copy in memory); for full fine-tuning it is a second copy of the starting model, or the
model `dpo.reference` names.
"""

from __future__ import annotations

from recipeforge.stages.base import TrainerStage

# TRL's name for the NLL term on chosen answers among DPOConfig.loss_type values
TRL_NLL_LOSS = "sft"


def dpo_arguments(recipe, config_cls) -> dict:
    """The DPOConfig fields of the `dpo:` section: beta, the loss (with RPO's NLL term), lengths."""
    from recipeforge.stages.trl_lengths import length_arguments

    d = recipe.dpo
    losses, weights = [d.loss_type], None
    if d.rpo_alpha:
        # RPO: the preference loss plus an NLL term on chosen answers, weighted by rpo_alpha.
        losses, weights = [d.loss_type, TRL_NLL_LOSS], [1.0, d.rpo_alpha]
    # Every length limit the installed TRL has comes from the recipe: prompts are cut only by
    # dpo.max_prompt_length (recipeforge cuts them itself, in prepare_data), whole pairs by
    # data.sequence_len; a TRL default never applies.
    lengths = length_arguments(config_cls, max_length=recipe.data.sequence_len,
                               max_prompt_length=d.max_prompt_length, max_completion_length=None)
    return dict(beta=d.beta, loss_type=losses, loss_weights=weights, label_smoothing=d.label_smoothing, **lengths,
                disable_dropout=True, dataset_num_proc=recipe.data.num_proc if recipe.data.num_proc > 1 else None)


class DPOStage(TrainerStage):
    """DPO on prompt/chosen/rejected rows (a vision-language model's: `stages.vision.VisionDPOStage`)."""

    stage = "dpo"
    trainer_class = "trl.DPOTrainer"

    def __new__(cls, ctx, *args, **kwargs):
        from recipeforge.components.vision_model import is_vision_recipe

        if cls is DPOStage and is_vision_recipe(ctx.recipe):
            from recipeforge.stages.vision import VisionDPOStage

            return VisionDPOStage(ctx)
        return super().__new__(cls)

    def prepare_data(self):
        return self.prepare_rows("preference", max_prompt_length=self.recipe.dpo.max_prompt_length)

    def reference_model(self):
        """The frozen reference model (`TrainerStage.frozen_reference` of `dpo.reference`)."""
        return self.frozen_reference(self.recipe.dpo.reference)

    def build_trainer(self):
        from recipeforge.outputs.atomic import crash_safe
        from trl import DPOConfig, DPOTrainer

        args = self.training_arguments(DPOConfig, **dpo_arguments(self.recipe, DPOConfig))
        return crash_safe(DPOTrainer)(model=self.model, ref_model=self.reference_model(), args=args,
                          train_dataset=self.train_rows, eval_dataset=self.eval_rows,
                          processing_class=self.tokenizer, peft_config=self.peft_config(),
                          callbacks=self.callbacks())
