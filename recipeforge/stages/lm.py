"""Causal-LM training on the transformers `Trainer`: what pretraining and SFT share.

Tokenization, label masking and packing happen once in `components.lm_data` (cached; the stage's
data step is `stages.lm_prep`); the trainer only sees token ids, labels and position ids, and the
collator pads them. With no per-step text processing, a step costs what the model's forward and
backward cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Trainer, TrainerControl, TrainerState, TrainingArguments

    from recipeforge.components.prepared import PreparedData


class LMStage(TrainerStage):
    """Pretraining or SFT on tokenized (optionally packed) data."""

    trainer_class = "transformers.Trainer"

    def prepare_data(self) -> PreparedData:
        """Tokenized, masked and packed sequences, or a stream of them (`stages.lm_prep.prepare_lm`)."""
        from recipeforge.stages.lm_prep import prepare_lm

        return prepare_lm(self.ctx, self.tokenizer)

    def load_model(self) -> PreTrainedModel:  # a PeftModel with adapters
        model = super().load_model()
        if self.recipe.adapter.type != "none":
            model = self.builder.with_lora(model)
        # With a KV cache the models skip building the packed (block-diagonal) mask; training needs none.
        model.config.use_cache = False
        return model

    def trainer_type(self, base: type[Trainer]) -> type[Trainer]:
        """The trainer class built on `base` (transformers' Trainer, or its streamed form); a stage with
        its own loss returns a subclass."""
        return base

    def build_trainer(self) -> Trainer:
        from recipeforge.outputs.atomic import crash_safe
        from transformers import Trainer, TrainerCallback, TrainingArguments

        from recipeforge.components.collate import LMCollator, pad_multiple

        data = self.prepared
        collator = LMCollator(self.tokenizer.pad_token_id, packed=data.packed,
                              pad_to_multiple_of=None if data.packed else pad_multiple(self.context.plan.device))
        self.collator = collator
        self.extra_log_sources.append(collator.counter.take)

        class ForgetEvalBatches(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here (`Any`)
            """Evaluation batches go through the same collator; keep them out of the padding share."""

            def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                            **kwargs: Any) -> None:
                collator.counter.real = collator.counter.total = 0

        # Our collator needs the position_ids/labels columns as they are: no column pruning.
        streaming = self.recipe.data.streaming
        args = self.training_arguments(TrainingArguments, remove_unused_columns=False,
                                       **({"ignore_data_skip": True} if streaming else {}))
        if streaming:
            from recipeforge.stages.streamed_trainer import order_log_path, streamed

            if self.recipe.data.stream_log:
                data.train.order_log = order_log_path(self.context.run.root, self.context.dist.rank)
        trainer_cls: Any = self.trainer_type(streamed(Trainer) if streaming else Trainer)
        return crash_safe(trainer_cls)(model=self.model, args=args, data_collator=collator, train_dataset=data.train,
                       eval_dataset=data.eval, processing_class=self.tokenizer,
                       callbacks=self.callbacks() + [ForgetEvalBatches()])
