"""The stage-runner protocol, the contexts a runner gets, and what every trainer-based runner shares.

A stage runner does three things: `setup()` (tokenizer, data, model, trainer), `train()` and
`save()` (final/). Runners read the recipe and the plan and never plan again; they hold no
per-backend code. Each part of a run is built by its own module: the data by the stage's
`prepare_data` (a frozen `components.prepared.PreparedData`), the model by
`stages.model_builder.ModelBuilder` and `stages.model_setup`, the trainer arguments by the pure
`stages.trainer_args.trainer_arguments` (merged in `stages.trainer_setup`), the callbacks by
`stages.callbacks.run_callbacks`, the refusals by `stages.run_checks`, final/ by
`stages.final_weights`. A stage itself only says how to prepare its data and build its trainer. A backend contributes trainer
arguments through `StageContext.backend_kwargs`, merged in exactly one place
(`TrainerStage.training_arguments`), after the stage's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from recipeforge.components.prepared import PreparedData
from recipeforge.config.secrets import public
from recipeforge.errors import RecipeError
from recipeforge.stages.context import DistInfo, RecipeContext, StageContext, WorkerHooks, quiet
from recipeforge.stages.trainer_args import BNB_OPTIMIZERS, OPTIMIZERS, SCHEDULERS, runner_checkpoints

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback

    from recipeforge.components.kernels import KernelEffects
    from recipeforge.components.vocab import VocabChange
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.stages.model_builder import ModelBuilder

# The class of a stage's trainer arguments (TrainingArguments, a TRL config).
_Arguments = TypeVar("_Arguments")

__all__ = ["BNB_OPTIMIZERS", "OPTIMIZERS", "SCHEDULERS", "DistInfo", "RecipeContext", "StageContext",
           "StageRunner", "TrainerStage", "WorkerHooks", "trainer_error"]

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
        from recipeforge.outputs.console import TokenRate

        self.ctx: RecipeContext = ctx  # a StageContext when training (`context`); a RecipeContext for data alone
        self.recipe: Recipe = ctx.recipe
        self.tokenizer: Any = None  # a PreTrainedTokenizerBase, once `load_tokenizer` ran
        self.processor: Any = None  # a vision-language model's processor (`stages.vision`), else None
        self.vocab: VocabChange | None = None
        self.data: PreparedData | None = None
        self.models: ModelBuilder | None = None
        self.model: Any = None  # a PreTrainedModel (a PeftModel with adapters added), once `load_model` ran
        self.trainer: Any = None  # a transformers Trainer (or a TRL one), once `build_trainer` ran
        self.kernels: KernelEffects | None = None
        self.extra_log_sources: list[Callable[[], dict[str, Any]]] = []
        self.token_rate = TokenRate()  # tokens/s in every training record, once the trainer counts
        self.trackers: list[TrainerCallback] = []  # W&B / MLflow callbacks (`outputs.trackers`), finished by `train`
        self.model_load_seconds: float | None = None  # building or reading the model (`load_model`)

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
        from recipeforge.components.data_checks import check_data_numbers
        from recipeforge.components.kernels import apply_kernels

        ctx = self.context
        self.check()  # before anything loads
        self.kernels = apply_kernels(self.recipe.kernels, ctx.plan.device, log=ctx.log)
        data = self.data or self.prepare()  # prepared already on a machine's first rank (`backends.data_ready`)
        # Batch, steps and warmup against the data, before the model loads.
        check_data_numbers(self.recipe, ctx.plan, data, log=ctx.log if ctx.dist.is_main else quiet)
        self.model = self.load_model()
        if runner_checkpoints(ctx.plan):  # selective, or every N-th layer (`stages.checkpointing`)
            from recipeforge.stages.checkpointing import SELECTIVE, enable_checkpointing

            enable_checkpointing(self.model, selective=ctx.plan.checkpoint_mode == SELECTIVE,
                                 every=ctx.plan.checkpoint_every)
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

        seconds = finish_trainer(self.context, self.trainer, self.token_rate)
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
        """Run the trainer (resuming when the context says so), then evaluate once at the end."""
        from recipeforge.outputs.trackers import close_all
        from recipeforge.stages.preemption import raise_if_stopped

        resume = str(self.context.resume_from) if self.context.resume_from else None
        failed = True
        try:
            result = self.trainer.train(resume_from_checkpoint=resume)
            failed = False
            raise_if_stopped(self.trainer)  # stopped on a signal: checkpoint saved, no final evaluation
            metrics = dict(result.metrics)
            if self.has_eval and not self._evaluated_at(self.trainer.state.global_step):
                metrics.update(self.trainer.evaluate())
        finally:
            # Tracker runs end here, before the final save and the end of the process group (a W&B run
            # left to the interpreter's exit would be torn down after the group is gone).
            close_all(self.trackers, failed=failed)
        return metrics

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
        from recipeforge.components.adapters import lora_config

        if self.recipe.adapter.type == "none":
            return None
        return lora_config(self.recipe.adapter, trainable_tokens=self.builder.trainable_tokens(self.model),
                           target_modules=self.builder.lora_targets(self.model), moe=self.builder.moe_lora(self.model))

    def frozen_reference(self, name: str) -> PreTrainedModel | None:
        """The frozen reference model of a preference stage (`ModelBuilder.reference`)."""
        return self.builder.reference(name, location=self.ctx.locate((self.stage, "reference")))

    def callbacks(self) -> list[TrainerCallback]:
        """Every callback of the run (`stages.callbacks.run_callbacks`); the tracker ones are kept to
        be closed when training ends."""
        from recipeforge.stages.callbacks import run_callbacks

        wandb = self.recipe.logging.wandb
        made = run_callbacks(self.context, log_sources=[*self.extra_log_sources, self.token_rate],
                             run_name=self._run_name(),
                             wandb_name=public(self.ctx.loaded, ("logging", "wandb", "name"), wandb.name)
                             if wandb else None)
        self.trackers = made.trackers
        from recipeforge.stages import fp8

        made.all.extend(fp8.callbacks(self.context, self.model))  # FSDP2 float8 all-gather: scales per step
        base = self.models.save_callback() if self.models is not None else None
        # A checkpoint's adapter names base_model/: a random-init base is written with the first one.
        return [*made.all, base] if base is not None else made.all

    def training_arguments(self, cls: type[_Arguments], **stage_kwargs: Any) -> _Arguments:
        """Build `cls` (TrainingArguments or a TRL config): common settings, then the stage's, then
        the backend's — the single place where backend trainer arguments are merged."""
        from recipeforge.stages.trainer_setup import training_arguments

        return training_arguments(self.context, cls, self.common_arguments(), stage_kwargs)

    def common_arguments(self) -> dict[str, Any]:
        """The arguments every stage shares (`stages.trainer_args`), plus the kernels' own."""
        from recipeforge.stages.trainer_setup import common_arguments

        return common_arguments(self.context, has_eval=self.has_eval, run_name=self._run_name(), kernels=self.kernels)

    def _run_name(self) -> str | None:
        """The run's name for trackers and training_args.bin: never one read from a secret variable."""
        name: str | None = public(self.ctx.loaded, ("name",), self.recipe.name)
        return name or (Path(self.ctx.loaded.path).stem if self.ctx.loaded.path else None)

    def _evaluated_at(self, step: int) -> bool:
        return any(h.get("step") == step and any(k.startswith("eval_") for k in h)
                   for h in self.trainer.state.log_history)


def trainer_error(stage: str, trainer_class: str, exc: BaseException) -> RecipeError:
    """The user error for `exc`, raised by the training library while the stage's trainer (or its
    arguments) was built: one line with the library's own message, and which version said it."""
    from importlib import metadata

    library = (trainer_class or "transformers").split(".")[0]
    try:
        version = f"{library} {metadata.version(library)}"
    except metadata.PackageNotFoundError:
        version = library
    said = " ".join(str(exc).split())
    said = said if len(said) <= 400 else said[:397] + "..."
    return RecipeError(f"building the {stage} trainer ({trainer_class or 'trainer'}) failed: "
                       f"{type(exc).__name__}: {said}", key="stage",
                       hint=f"the installed {version} refused the settings this recipe leads to; change the "
                            f"setting it names, or install the version recipeforge supports "
                            f"(--debug shows the traceback)")
