"""The stage-runner protocol, the contexts a runner gets, and what every trainer-based runner shares.

A stage runner does three things: `setup()` (tokenizer, data, model, trainer), `train()` and
`save()` (final/). Runners read the recipe and the plan and never plan again; they hold no
per-backend code. Each part of a run is built by its own module: the data by the stage's
`prepare_data` (a frozen `components.prepared.PreparedData`), the model by
`stages.model_builder.ModelBuilder` and `stages.model_setup`, the trainer arguments by the pure
`stages.trainer_args.trainer_arguments` (merged in `stages.trainer_setup`), the callbacks and the
run's measuring parts by `stages.telemetry`, the training loop and the final evaluation by
`stages.training_loop`, the refusals by `stages.run_checks`, final/ by `stages.final_weights`. A
stage itself only says how to prepare its data and build its trainer. A backend contributes trainer
arguments through `StageContext.backend_kwargs`, merged in exactly one place
(`TrainerStage.training_arguments`), after the stage's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from recipeforge.components.prepared import PreparedData
from recipeforge.stages.context import DistInfo, RecipeContext, StageContext, WorkerHooks
from recipeforge.stages.telemetry import Telemetry
from recipeforge.stages.trainer_setup import trainer_error

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback

    from recipeforge.components.kernels import KernelEffects
    from recipeforge.components.vocab import VocabChange
    from recipeforge.stages.model_builder import ModelBuilder

# The class of a stage's trainer arguments (TrainingArguments, a TRL config).
_Arguments = TypeVar("_Arguments")

__all__ = ["DistInfo", "RecipeContext", "StageContext", "StageRunner", "TrainerStage", "WorkerHooks",
           "trainer_error"]


class StageRunner(Protocol):
    """What the train entry calls, in this order."""

    def setup(self) -> None: ...

    def train(self) -> dict[str, Any]: ...

    def save(self) -> Path: ...


class TrainerStage:
    """What the runners built on a transformers/TRL trainer share. A subclass says how to prepare its
    data (`prepare_data`) and how to build its trainer (`build_trainer`); the rest comes from here."""

    stage: str = ""
    trainer_class: str = ""  # the library class `build_trainer` constructs, e.g. "trl.DPOTrainer"
    num_labels: int | None = None  # outputs of a sequence-classification head (reward models); None: the LM head
    takes_images = False  # whether the runner trains vision-language models (`stages.vision`)

    def __init__(self, ctx: RecipeContext):
        self.ctx: RecipeContext = ctx  # a StageContext when training (`context`); a RecipeContext for data alone
        self.recipe = ctx.recipe
        self.tokenizer: Any = None  # a PreTrainedTokenizerBase, once `load_tokenizer` ran
        self.processor: Any = None  # a vision-language model's processor (`stages.vision`), else None
        self.vocab: VocabChange | None = None
        self.data: PreparedData | None = None
        self.models: ModelBuilder | None = None
        self.model: Any = None  # a PreTrainedModel (a PeftModel with adapters added), once `load_model` ran
        self.trainer: Any = None  # a transformers Trainer (or a TRL one), once `build_trainer` ran
        self.kernels: KernelEffects | None = None
        self.telemetry = Telemetry()  # tokens/s, extra record values, trackers (`stages.telemetry`)
        # values each training record adds (a stage appends its own before its callbacks are made)
        self.extra_log_sources: list[Callable[[], dict[str, Any]]] = self.telemetry.log_sources
        self.model_load_seconds: float | None = None  # building or reading the model (`load_model`)

    @property
    def trackers(self) -> list[TrainerCallback]:
        """The W&B / MLflow callbacks (`outputs.trackers`), once `callbacks` made them; `train` ends them."""
        return self.telemetry.trackers

    @property
    def data_stats(self) -> dict[str, Any]:
        """The statistics of the prepared data (empty before `prepare`)."""
        return dict(self.data.stats) if self.data is not None else {}

    @property
    def has_eval(self) -> bool:
        return self.data is not None and self.data.has_eval

    @property
    def context(self) -> StageContext:
        """The training context (a runner built for data preparation alone has none)."""
        if not isinstance(self.ctx, StageContext):
            raise TypeError(f"{type(self).__name__} was built to prepare data only: it has no plan or run")
        return self.ctx

    # --- the protocol -------------------------------------------------------------------------
    def setup(self) -> None:
        """Checks, tokenizer and data (fails fast on data errors), model, trainer."""
        from recipeforge.components.kernels import apply_kernels
        from recipeforge.stages.trainer_setup import enable_runner_checkpointing
        from recipeforge.stages.run_checks import check_data

        ctx = self.context
        self.check()  # before anything loads
        self.kernels = apply_kernels(self.recipe.kernels, ctx.plan.device, log=ctx.log)
        data = self.data or self.prepare()  # prepared already on a machine's first rank (`backends.data_ready`)
        check_data(ctx, data)  # batch, steps and warmup against the data, before the model loads
        self.model = self.load_model()
        enable_runner_checkpointing(ctx, self.model)  # selective, or every N-th layer, when the plan says so
        ctx.barrier()  # rank 0 may have written base_model/, which trainers load by path
        self.trainer = self.build_trainer_explained()
        self.finish_trainer()

    def check(self) -> None:
        """Refuse, before anything loads, what this run cannot do on its plan (`stages.run_checks`)."""
        from recipeforge.stages.run_checks import check_run

        check_run(self.context, self.stage or self.recipe.stage, takes_images=self.takes_images)

    def prepare(self) -> PreparedData:
        """Tokenizer, then the stage's data (`prepare_data`), kept on the runner and printed."""
        self.tokenizer = self.load_tokenizer()
        self.data = self.prepare_data()
        self.ctx.log(self.data.describe())
        return self.data

    def finish_trainer(self) -> None:
        """What follows the trainer's construction (`stages.trainer_setup.finish_trainer`): the backend's
        completion of a model loaded sharded, activation offloading, the token counter and the progress line."""
        from recipeforge.stages.trainer_setup import finish_trainer

        seconds = finish_trainer(self.context, self.trainer, self.telemetry.token_rate)
        if self.model_load_seconds is not None:
            self.model_load_seconds += seconds

    def build_trainer_explained(self) -> Trainer:
        """`build_trainer`, with a configuration or constructor error of the training library turned
        into a user error naming the stage, the trainer and the library's message (the original stays
        attached as the cause: ``--debug`` shows its traceback)."""
        from recipeforge.stages.trainer_setup import attach_optimizer

        try:
            trainer = self.build_trainer()
        except (TypeError, ValueError, ImportError) as exc:
            raise trainer_error(self.stage or self.recipe.stage, self.trainer_class, exc) from exc
        attach_optimizer(self.context, trainer)
        return trainer

    def train(self) -> dict[str, Any]:
        """Run the trainer (resuming when the context says so), then evaluate once at the end
        (`stages.training_loop`)."""
        from recipeforge.stages.training_loop import train_and_evaluate

        resume = str(self.context.resume_from) if self.context.resume_from else None
        return train_and_evaluate(self.trainer, resume_from=resume, has_eval=self.has_eval, telemetry=self.telemetry)

    def save(self) -> Path:
        """Write final/: full weights (safetensors) or the adapter, plus the tokenizer."""
        from recipeforge.stages.final_weights import save_final_weights

        ctx = self.context
        if self.models is not None:  # an adapter's random-init base, unless a checkpoint wrote it
            self.models.write_base()
        model = self.trainer.accelerator.unwrap_model(self.trainer.model) if self.trainer is not None else self.model
        # A VLM's processor is saved with it: tokenizer, image processor and chat template.
        files = self.processor if self.processor is not None else self.tokenizer
        save_final_weights(ctx, self.trainer, model, files)
        return ctx.run.final

    # --- what a stage says ----------------------------------------------------------------------
    def prepare_data(self) -> PreparedData:
        """The stage's training and eval data, read, checked and prepared for its trainer."""
        raise NotImplementedError

    def build_trainer(self) -> Trainer:
        """The stage's trainer, built from `self.data`, `self.model`, `training_arguments` and
        `callbacks`."""
        raise NotImplementedError

    def prepare_rows(self, kind: str, *, max_prompt_length: int | None, unit: str = "rows") -> PreparedData:
        """Rows of `kind` for a TRL trainer that tokenizes itself (`stages.rows.prepare_rows`)."""
        from recipeforge.stages.rows import prepare_rows

        return prepare_rows(self.ctx, self.tokenizer, (kind,), max_prompt_length=max_prompt_length, unit=unit)

    def needs_base_on_disk(self) -> bool:
        """Whether the trainer loads the starting model again by its name (a reference model)."""
        return False

    # --- building blocks ----------------------------------------------------------------------
    def load_tokenizer(self) -> PreTrainedTokenizerBase:
        """The recipe's tokenizer, with the chat template and the recipe's tokens added (before anything
        is tokenized: the data cache key includes them); `vocab` records what was added."""
        from recipeforge.stages.model_setup import load_tokenizer

        tokenizer, self.vocab = load_tokenizer(self.ctx)
        return tokenizer

    def load_model(self) -> PreTrainedModel:
        """The model the trainer gets: the base (`ModelBuilder.base`) with what the recipe does to it
        before training (`stages.model_setup.finish_base`: MoE, unfrozen parameters, QAT, fp8)."""
        import time

        from recipeforge.stages.model_setup import finish_base

        started = time.perf_counter()
        model = self.builder.base()
        finish_base(self.context, model, self.extra_log_sources)
        # A full-size model takes minutes to build or read; the line says where a slow start went, and
        # the run's records keep it (metrics.jsonl, split "startup").
        self.model_load_seconds = time.perf_counter() - started
        self.ctx.log(f"model: {self.recipe.model.name_or_path} ready in {self.model_load_seconds:.1f}s")
        return model

    @property
    def builder(self) -> "ModelBuilder":
        """The run's `ModelBuilder` (made on first use, once the tokenizer is loaded)."""
        from recipeforge.stages.model_builder import ModelBuilder

        if self.models is None:
            self.models = ModelBuilder(self.context, self.tokenizer, self.vocab, num_labels=self.num_labels,
                                       base_on_disk=self.needs_base_on_disk(), processor=self.processor)
        return self.models

    @property
    def train_rows(self) -> Any:
        return self.prepared.train

    @property
    def eval_rows(self) -> Any:
        return self.prepared.eval

    @property
    def prepared(self) -> PreparedData:
        if self.data is None:
            raise TypeError("the data is prepared by `setup` (or `prepare`)")
        return self.data

    def peft_config(self) -> LoraConfig | None:
        """The LoRA config of the recipe, or None for full fine-tuning."""
        return self.builder.lora_config(self.model)

    def frozen_reference(self, name: str) -> PreTrainedModel | None:
        """The frozen reference model of a preference stage (`ModelBuilder.reference`)."""
        return self.builder.reference(name, location=self.ctx.locate((self.stage, "reference")))

    def callbacks(self) -> list[TrainerCallback]:
        """Every callback of the run (`stages.telemetry.trainer_callbacks`); the tracker ones are kept to
        be closed when training ends."""
        from recipeforge.stages.telemetry import trainer_callbacks

        return trainer_callbacks(self.context, self.telemetry, self.model, self.models)

    def training_arguments(self, cls: type[_Arguments], **stage_kwargs: Any) -> _Arguments:
        """Build `cls` (TrainingArguments or a TRL config): common settings, then the stage's, then
        the backend's — the single place where backend trainer arguments are merged."""
        from recipeforge.stages.trainer_setup import training_arguments

        return training_arguments(self.context, cls, self.common_arguments(), stage_kwargs)

    def common_arguments(self) -> dict[str, Any]:
        """The arguments every stage shares (`stages.trainer_args`), plus the kernels' own."""
        from recipeforge.stages.telemetry import run_name
        from recipeforge.stages.trainer_setup import common_arguments

        return common_arguments(self.context, has_eval=self.has_eval, run_name=run_name(self.ctx), kernels=self.kernels)
