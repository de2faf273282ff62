"""Direct Preference Optimization on TRL's `DPOTrainer`.

The reference model is handled as TRL does: with an adapter it is the base with adapters disabled
(no second copy in memory); for full fine-tuning it is a second copy of the starting model, or the
model `dpo.reference` names.
"""

from __future__ import annotations

from recipeforge.stages.base import TrainerStage

# TRL's name for the NLL term on chosen answers among DPOConfig.loss_type values
TRL_NLL_LOSS = "sft"


class DPOStage(TrainerStage):
    """DPO on prompt/chosen/rejected rows."""

    stage = "dpo"
    trainer_class = "trl.DPOTrainer"

    def prepare_data(self):
        return self.prepare_rows("preference", max_prompt_length=self.recipe.dpo.max_prompt_length)

    def reference_model(self):
        """The frozen reference model (`TrainerStage.frozen_reference` of `dpo.reference`)."""
        return self.frozen_reference(self.recipe.dpo.reference)

    def build_trainer(self):
        from recipeforge.outputs.atomic import crash_safe
        from recipeforge.stages.trl_lengths import length_arguments
        from trl import DPOConfig, DPOTrainer

        d = self.recipe.dpo
        losses, weights = [d.loss_type], None
        if d.rpo_alpha:
            # RPO: the preference loss plus an NLL term on chosen answers, weighted by rpo_alpha.
            losses, weights = [d.loss_type, TRL_NLL_LOSS], [1.0, d.rpo_alpha]
        # Every length limit the installed TRL has comes from the recipe: prompts are cut only by
        # dpo.max_prompt_length (recipeforge cuts them itself, in prepare_data), whole pairs by
        # data.sequence_len; a TRL default never applies.
        lengths = length_arguments(DPOConfig, max_length=self.recipe.data.sequence_len,
                                   max_prompt_length=d.max_prompt_length, max_completion_length=None)
        args = self.training_arguments(
            DPOConfig, beta=d.beta, loss_type=losses, loss_weights=weights, label_smoothing=d.label_smoothing,
            **lengths, disable_dropout=True,
            dataset_num_proc=self.recipe.data.num_proc if self.recipe.data.num_proc > 1 else None)
        return crash_safe(DPOTrainer)(model=self.model, ref_model=self.reference_model(), args=args,
                          train_dataset=self.train_rows, eval_dataset=self.eval_rows,
                          processing_class=self.tokenizer, peft_config=self.peft_config(),
                          callbacks=self.callbacks())
