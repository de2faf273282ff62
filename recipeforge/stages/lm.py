"""Causal-LM training on the transformers `Trainer`: what pretraining and SFT share.

Tokenization, label masking and packing happen once in `components.lm_data` (cached); the trainer
only sees token ids, labels and position ids, and the collator pads them. With no per-step text
processing, a step costs what the model's forward and backward cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recipeforge.components.prepared import PreparedData
from recipeforge.stages.base import TrainerStage

if TYPE_CHECKING:
    from transformers import PreTrainedModel, Trainer, TrainerControl, TrainerState, TrainingArguments

    from recipeforge.config.schema.data import DatasetSpec


class LMStage(TrainerStage):
    """Pretraining or SFT on tokenized (optionally packed) data."""

    trainer_class = "transformers.Trainer"

    def prepare_data(self) -> PreparedData:
        from recipeforge.components.formats import get_format
        from recipeforge.components.lm_data import prepare_lm_data
        from recipeforge.components.template_check import check_run_template
        from recipeforge.components.tokenizer import set_chat_template

        data = self.recipe.data
        specs = list(data.datasets) + list(data.eval_datasets)
        # Rows written with a text prompt (`prompt:`) do not go through the chat template.
        conversational = any(get_format(s.format).conversational({}) and getattr(s, "prompt", None) is None
                             for s in specs)
        set_chat_template(self.tokenizer, data.chat_template, required=conversational,
                          location=self.ctx.locate(("data", "chat_template")))
        self._prompt_as_chat_template(specs)
        # Chat data: a template whose trained tokens a server would not give the model again is refused
        # before anything is tokenized (`data.template_check`).
        replies = check_run_template(self.tokenizer, self.recipe, base_dir=self.ctx.base_dir, locate=self.ctx.locate)
        if replies is not None:
            self.ctx.log(f"chat template: training and serving give the same tokens before each of {replies} probe "
                         f"replies")
        if data.streaming:
            return self.streamed_data()
        lm = prepare_lm_data(self.recipe, self.tokenizer, base_dir=self.ctx.base_dir, locate=self.ctx.locate)
        return PreparedData(train=lm.train, eval=lm.eval, stats=dict(lm.stats), packed=lm.packed,
                            unit="packed sequences" if lm.packed else "sequences",
                            fingerprint=lm.fingerprint, cache_path=lm.cache_path)

    def _prompt_as_chat_template(self, specs: list[DatasetSpec]) -> None:
        """When every dataset is written with the same text prompt and the recipe names no chat template,
        the tokenizer saved with the model gets a chat template that writes that prompt, so `recipeforge
        chat` and `serve` prompt the model the way it was trained (not with the tokenizer's own template)."""
        from recipeforge.components.text_prompt import chat_template
        from recipeforge.components.tokenizer import special_prefix_ids

        prompts = {getattr(s, "prompt", None) for s in specs}
        if len(prompts) != 1 or None in prompts or self.recipe.data.chat_template != "tokenizer":
            return
        template = chat_template(prompts.pop(), bos=bool(special_prefix_ids(self.tokenizer)))
        if template is not None:
            self.tokenizer.chat_template = template

    def streamed_data(self) -> PreparedData:
        """`data.streaming`: this process's stream of training sequences (`components.lm_stream`), and the
        eval datasets tokenized and cached as usual. Preparing the data before a launch (or `recipeforge
        preprocess`) reads the first window only: the rows' errors show before any worker starts."""
        from recipeforge.stages.context import StageContext
        from recipeforge.stages.streamed_data import check_stream_layout, eval_data, probe, training_stream

        plan = self.ctx.plan if isinstance(self.ctx, StageContext) else None  # None: data prepared alone
        training = plan is not None
        if plan is not None:
            check_stream_layout(plan.data_parallel or 1, self.ctx.dist.world_size,
                                location=self.ctx.locate(("data", "streaming")))
        stream = training_stream(self.recipe, self.tokenizer, self.ctx, rank=self.ctx.dist.rank if training else 0,
                                 world=self.ctx.dist.world_size if training else 1)
        evaluation = eval_data(self.recipe, self.tokenizer, self.ctx)
        stats = stream.stats() if training else probe(stream)
        if evaluation is not None:
            stats["eval_rows"] = len(evaluation.train)
        return PreparedData(train=stream, eval=evaluation.train if evaluation is not None else None, stats=stats,
                            packed=bool(self.recipe.data.packing),
                            unit="packed sequences" if self.recipe.data.packing else "sequences")

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
