"""The stage-runner protocol, and what every runner shares.

A stage runner does three things: `setup()` (tokenizer, data, model, trainer), `train()` and
`save()` (final/). Runners read the recipe and the plan and never plan again; they hold no
per-backend code. A backend contributes trainer arguments through `StageContext.backend_kwargs`,
merged in exactly one place (`TrainerStage.training_arguments`), after the stage's own.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from recipeforge.config.secrets import public
from recipeforge.errors import Location, RecipeError
from recipeforge.outputs.run_dir import RunDir

OPTIMIZERS = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit",
              "paged_adamw_8bit": "paged_adamw_8bit", "paged_adamw_32bit": "paged_adamw_32bit",
              "adafactor": "adafactor", "sgd": "sgd", "lion_8bit": "lion_8bit",
              # torchao's low-bit AdamW through the Trainer's own optimizer names
              "adamw_torchao_8bit": "adamw_torch_8bit", "adamw_torchao_4bit": "adamw_torch_4bit"}
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "lion_8bit")
SCHEDULERS = {"linear": ("linear", {}), "cosine": ("cosine", {}),
              "cosine_with_min_lr": ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
              "constant": ("constant", {}), "constant_with_warmup": ("constant_with_warmup", {}),
              # wsd: the phases depend on the run's real number of steps, which the trainer knows only
              # when training starts: `components.schedules.wsd_callback` sets them then.
              "wsd": ("warmup_stable_decay", {"decay_type": "cosine", "num_decay_steps": 0})}


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a launched job (torchrun / accelerate launch set the variables)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, environ=os.environ) -> "DistInfo":
        def num(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default
        return cls(num("RANK", 0), num("LOCAL_RANK", 0), num("WORLD_SIZE", 1))


def _log(message: str) -> None:
    from recipeforge.credentials import redact_credentials

    print(f"[recipeforge] {redact_credentials(message)}", file=sys.stderr, flush=True)


def _no_wait() -> None:
    """The barrier of a single process: nobody to wait for."""


@dataclass
class StageContext:
    """Everything a stage runner gets: the loaded recipe, the plan, the run directory, and what it
    needs from the distributed side as plain callables handed in by the runner (`recipeforge.run`):
    a barrier and the final-weights saver. Stages never import a backend or hold one."""

    loaded: Any                       # config.LoadedRecipe (recipe, path, provenance tree)
    plan: Any                         # plan.types.Plan
    run: RunDir
    resume_from: Path | None = None
    dist: DistInfo = field(default_factory=DistInfo)
    backend_kwargs: dict = field(default_factory=dict)   # trainer arguments from the backend (merged last)
    callbacks: list = field(default_factory=list)        # extra TrainerCallbacks
    log: Callable[[str], None] = _log
    # Waits for every process of a launched job (one process: returns at once).
    barrier: Callable[[], None] = _no_wait
    # save_final(ctx, trainer, model, tokenizer) writes final/, called on every rank since gathering
    # sharded weights is collective (the backend's `save_final`); None: the main process saves.
    save_final: Callable[..., Any] | None = None
    # load_sharded(path, dtype=, attn_implementation=, revision=, trust_remote_code=) loads the model
    # already sharded (the backend's tensor-parallel loader, set in its `setup_worker`); None: whole.
    load_sharded: Callable[..., Any] | None = None
    # prepare_trainer(trainer) finishes a model that `load_sharded` left incomplete, once the trainer
    # (and its Accelerator) exists, before training (a QLoRA base filled after sharding); None: nothing.
    prepare_trainer: Callable[[Any], None] | None = None

    @property
    def recipe(self):
        return self.loaded.recipe

    @property
    def base_dir(self) -> Path | None:
        path = getattr(self.loaded, "path", None)
        return Path(path).resolve().parent if path else None

    def locate(self, path: tuple) -> Location | None:
        """Where the recipe sets the key at `path` (for error messages)."""
        tree = getattr(self.loaded, "tree", None)
        return tree.locate(path) if tree is not None else None


class StageRunner(Protocol):
    """What the train entry calls, in this order."""

    def setup(self) -> None: ...

    def train(self) -> dict: ...

    def save(self) -> Path: ...


class TrainerStage:
    """Shared machinery of the runners built on a transformers/TRL trainer."""

    stage: str = ""
    trainer_class: str = ""  # the library class `build_trainer` constructs, e.g. "trl.DPOTrainer"
    num_labels: int | None = None  # outputs of a sequence-classification head (reward models); None: the LM head

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.recipe = ctx.recipe
        self.tokenizer = None
        self.model = None
        self.trainer = None
        self.data_stats: dict = {}
        self.extra_log_sources: list[Callable[[], dict]] = []
        from recipeforge.outputs.console import TokenRate

        self.token_rate = TokenRate()  # tokens/s in every training record, once the trainer counts
        self.has_eval = False
        self.trackers: list = []  # W&B / MLflow callbacks (`outputs.trackers`), finished by `train`

    # --- the protocol -------------------------------------------------------------------------
    def setup(self) -> None:
        """Tokenizer, then data (fails fast on data errors), then model, then trainer."""
        from recipeforge.components.kernels import apply_kernels
        from recipeforge.stages.precision import check_sr_optimizer

        check_sr_optimizer(self.ctx.plan)  # before anything loads
        if self.recipe.train.activation_offloading:
            from recipeforge.stages.activation_offload import check_activation_offloading

            check_activation_offloading(self.stage or self.recipe.stage, self.ctx.plan.device,
                                        location=self.ctx.locate(("train", "activation_offloading")))
        from recipeforge.stages.freezing import apply_unfrozen_parameters, check_low_bit_optimizer

        check_low_bit_optimizer(self.recipe.train.optimizer, location=self.ctx.locate(("train", "optimizer")))
        self.kernels = apply_kernels(self.recipe.kernels, self.ctx.plan.device, log=self.ctx.log)
        self.tokenizer = self.load_tokenizer()
        self.prepare_data()
        from recipeforge.components.data_checks import check_runner_numbers

        check_runner_numbers(self)  # batch, steps and warmup against the data, before the model loads
        self.model = self.load_model()
        if self.recipe.train.unfrozen_parameters:  # a partial full fine-tune: freeze the rest
            apply_unfrozen_parameters(self.model, list(self.recipe.train.unfrozen_parameters),
                                      locate=self.ctx.locate, log=self.ctx.log)
        self.ctx.barrier()  # rank 0 may have written base_model/, which trainers load by path
        self.trainer = self.build_trainer_explained()
        if self.ctx.prepare_trainer is not None:
            self.ctx.prepare_trainer(self.trainer)
        if self.recipe.train.activation_offloading:  # TRL's trainers with the field do it themselves
            from recipeforge.stages.activation_offload import wrap_training_step

            wrap_training_step(self.trainer)
        from recipeforge.outputs.console import attach_progress, attach_token_counter

        data_parallel = getattr(self.ctx.plan, "data_parallel", 1) or 1
        self.token_rate.counter = attach_token_counter(self.trainer, data_parallel)
        attach_progress(self.trainer, enabled=self.recipe.logging.progress_bar and self.ctx.dist.is_main,
                        data_parallel=data_parallel)

    def build_trainer_explained(self):
        """`build_trainer`, with a configuration or constructor error of the training library turned
        into a user error naming the stage, the trainer and the library's message (the original stays
        attached as the cause: ``--debug`` shows its traceback)."""
        try:
            trainer = self.build_trainer()
        except (TypeError, ValueError, ImportError) as exc:
            raise trainer_error(self.stage or self.recipe.stage, self.trainer_class, exc) from exc
        from recipeforge.stages.precision import sr_optimizer

        optimizer = sr_optimizer(self.ctx.plan, self.recipe.train)
        if optimizer is not None:  # pure bf16 with stochastic rounding: torchao's AdamW
            # Read by Trainer.create_optimizer, which runs when training starts.
            trainer.optimizer_cls_and_kwargs = optimizer
        return trainer

    def train(self) -> dict:
        """Run the trainer (resuming when the context says so), then evaluate once at the end."""
        resume = str(self.ctx.resume_from) if self.ctx.resume_from else None
        failed = True
        try:
            result = self.trainer.train(resume_from_checkpoint=resume)
            failed = False
            from recipeforge.stages.preemption import raise_if_stopped

            raise_if_stopped(self.trainer)  # stopped on a signal: checkpoint saved, no final evaluation
            metrics = dict(result.metrics)
            if self.has_eval and not self._evaluated_at(self.trainer.state.global_step):
                metrics.update(self.trainer.evaluate())
        finally:
            from recipeforge.outputs.trackers import close_all

            # Tracker runs end here, before the final save and the end of the process group (a W&B run
            # left to the interpreter's exit would be torn down after the group is gone).
            close_all(self.trackers, failed=failed)
        return metrics

    def save(self) -> Path:
        """Write final/: full weights (safetensors) or the adapter, plus the tokenizer."""
        from recipeforge.outputs.export import save_pretrained_atomic

        if self.trainer is not None:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        else:
            model = self.model
        if self.ctx.save_final is not None and self.trainer is not None:  # every rank: gathering is collective
            self.ctx.save_final(self.ctx, self.trainer, model, self.tokenizer)
        elif self.ctx.dist.is_main:
            save_pretrained_atomic(model, self.tokenizer, self.ctx.run.final)
        return self.ctx.run.final

    # --- building blocks ----------------------------------------------------------------------
    def load_tokenizer(self):
        from recipeforge.components.tiny_spec import TINY_CONFIGS, tiny_arch
        from recipeforge.components.tokenizer import load_tokenizer

        m = self.recipe.model
        arch = tiny_arch(m.name_or_path)
        vocab = TINY_CONFIGS.get(arch, {}).get("vocab_size") if arch else None
        tokenizer = load_tokenizer(m.tokenizer or m.name_or_path, revision=m.revision,
                                   trust_remote_code=m.trust_remote_code, vocab_size=vocab,
                                   location=self.ctx.locate(("model", "tokenizer" if m.tokenizer else "name_or_path")),
                                   key="model.tokenizer" if m.tokenizer else "model.name_or_path")
        from recipeforge.components.vocab import prepare_tokenizer

        # The chat template and the recipe's tokens go in before anything is tokenized (the data cache
        # key includes them); `load_model` gives the new tokens their embedding rows.
        self.vocab = prepare_tokenizer(tokenizer, self.recipe, base_dir=self.ctx.base_dir, locate=self.ctx.locate)
        if self.vocab.new_ids:
            self.ctx.log(f"vocab: {self.vocab.describe()}; their embedding rows start at the mean of the others "
                         f"and are trained")
        return tokenizer

    def prepare_data(self) -> None:
        raise NotImplementedError

    def prepare_rows(self, kind: str, *, max_prompt_length: int | None) -> None:
        """Rows for a TRL trainer that tokenizes itself (DPO: preference, GRPO: prompt)."""
        from recipeforge.components.data import format_rows, load_split, truncate_prompts
        from recipeforge.components.formats import RenderOptions
        from recipeforge.components.tokenizer import set_chat_template

        data = self.recipe.data
        set_chat_template(self.tokenizer, data.chat_template, required=False,
                          location=self.ctx.locate(("data", "chat_template")))
        opts = RenderOptions(self.tokenizer)
        train, evaluation, stats = load_split(data, (kind,), seed=self.recipe.train.seed, base_dir=self.ctx.base_dir,
                                              transform=lambda ds, fmt: format_rows(ds, opts), locate=self.ctx.locate)
        if max_prompt_length:
            train, cut = truncate_prompts(train, self.tokenizer, max_prompt_length)
            stats["prompts_truncated"] = cut
            if evaluation is not None:
                evaluation, _ = truncate_prompts(evaluation, self.tokenizer, max_prompt_length)
        conversational = "prompt" in train.column_names and isinstance(train[0]["prompt"], list)
        if conversational and not getattr(self.tokenizer, "chat_template", None):
            set_chat_template(self.tokenizer, data.chat_template, required=True,
                              location=self.ctx.locate(("data", "chat_template")))
        self.train_rows, self.eval_rows = train, evaluation
        self.has_eval = evaluation is not None
        self.data_stats = stats
        self.ctx.log("data: " + ", ".join(f"{k}={v}" for k, v in stats.items()))

    def load_model(self, *, for_reference: bool = False):
        """The base model, quantized for QLoRA; adapters are added by the runner (or its trainer)."""
        from recipeforge.components.adapters import prepare_quantized, quantization_config
        from recipeforge.components.models import load_model, resolve_dtype
        from recipeforge.components.tiny_spec import tiny_arch
        from recipeforge.outputs.export import save_base_model
        from recipeforge.stages.precision import loads_fp32_masters

        r, plan = self.recipe, self.ctx.plan
        m, a = r.model, r.adapter
        where = self.ctx.locate(("model", "name_or_path"))
        name = m.name_or_path
        quant = None
        dtype = m.dtype
        if a.type == "qlora":
            if str(resolve_dtype(m.dtype, plan.device)) == "torch.float32":
                dtype = "bf16"  # `auto` on a CPU: 4-bit layers compute in bf16, not fp32
            quant = quantization_config(a, resolve_dtype(dtype, plan.device), plan.device,
                                        location=self.ctx.locate(("adapter", "type")))
        elif not for_reference and loads_fp32_masters(plan, a.type, str(resolve_dtype(m.dtype, plan.device))):
            dtype = "fp32"  # mixed precision: fp32 master weights under 16-bit autocast (`stages.precision`)
        common = dict(device=plan.device, dtype=dtype, attn_implementation=m.attn_implementation,
                      revision=m.revision, trust_remote_code=m.trust_remote_code, seed=r.train.seed,
                      max_position_embeddings=m.max_position_embeddings, location=where,
                      vocab=getattr(self, "vocab", None))
        if self.num_labels is not None:  # a sequence-classification head instead of the LM head
            common["num_labels"] = self.num_labels
        random_init = tiny_arch(name) is not None or m.init == "random"
        if self.ctx.load_sharded is not None and not for_reference:
            model = self._load_sharded(name, common, random_init)
            if quant is not None:  # a 4-bit base the backend loads its own way (`backends.quantized_loading`)
                model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing,
                                          device=plan.device, sharded=True)
            return model
        if m.init == "random" and tiny_arch(name) is None:
            from recipeforge.plan.catalog import architecture_config

            common["random_config"] = architecture_config(name, m.revision)
        if random_init and (a.type != "none" or self.needs_base_on_disk()) and not for_reference:
            # The random-init base exists nowhere else: keep it next to the adapter (merging needs
            # it; a trainer building its own reference model loads it), and load it from there when
            # it has to be quantized.
            base = load_model(name, self.tokenizer, **common)
            if self.ctx.dist.is_main:
                save_base_model(base, self.tokenizer, self.ctx.run.base_model)
            if quant is not None:
                # Every rank loads the 4-bit base from the folder the first rank just wrote.
                self.ctx.barrier()
                base = load_model(str(self.ctx.run.base_model), self.tokenizer,
                                  **{**common, "random_config": None, "quantization_config": quant})
            base.config._name_or_path = str(self.ctx.run.base_model.resolve())
            # peft writes the adapter's base_model_name_or_path from this attribute (set only at
            # construction): with it, final/ loads through transformers' Auto classes on its own.
            base.name_or_path = base.config._name_or_path
            model = base
        else:
            model = load_model(name, self.tokenizer, **{**common, "quantization_config": quant})
        if quant is not None:
            model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing, device=plan.device,
                                      sharded=self.sharded_trainable_dtype() is not None)
        return model

    def sharded_trainable_dtype(self):
        """The one dtype of every trainable parameter when a QLoRA base is partitioned like any other
        weights (ZeRO-3, FSDP: its 4-bit weights are stored in the compute dtype and nothing is upcast,
        `components.adapters`), else None. fp32 under a GPU's mixed precision (FSDP computes in 16 bits
        through its policy, DeepSpeed through its own cast); on a CPU, which has no mixed precision,
        the compute dtype the 16-bit activations arrive in."""
        from recipeforge.components.models import resolve_dtype

        plan, dtype = self.ctx.plan, self.recipe.model.dtype
        if self.recipe.adapter.type != "qlora" or not self._weights_sharded():
            return None
        if plan.device == "cuda":
            return resolve_dtype("fp32", plan.device)
        resolved = resolve_dtype(dtype, plan.device)
        return resolve_dtype("bf16", plan.device) if str(resolved) == "torch.float32" else resolved

    def _weights_sharded(self) -> bool:
        from recipeforge.plan.memory import spec_of

        return spec_of(self.ctx.plan.backend).plan_shards_weights(self.ctx.plan)

    def _load_sharded(self, name: str, common: dict, random_init: bool):
        """The model loaded sharded by the backend's loader. A random-init model is written to
        base_model/ first (by the main process), since a sharded load reads a checkpoint."""
        from recipeforge.components.models import load_model, resolve_attn_implementation, resolve_dtype
        from recipeforge.outputs.export import save_base_model

        path = name
        if random_init:
            if self.ctx.dist.is_main:
                save_base_model(load_model(name, self.tokenizer, **common), self.tokenizer, self.ctx.run.base_model)
            self.ctx.barrier()
            path = str(self.ctx.run.base_model.resolve())
        return self.ctx.load_sharded(path, dtype=resolve_dtype(common["dtype"], common["device"]),
                                     attn_implementation=resolve_attn_implementation(
                                         common["attn_implementation"], common["device"]),
                                     revision=None if random_init else common["revision"],
                                     trust_remote_code=common["trust_remote_code"])

    def needs_base_on_disk(self) -> bool:
        """Whether the trainer loads the starting model again by its name (a reference model)."""
        return False

    def peft_config(self):
        """The LoRA config of the recipe, or None for full fine-tuning."""
        from recipeforge.components.adapters import lora_config

        if self.recipe.adapter.type == "none":
            return None
        return lora_config(self.recipe.adapter, trainable_tokens=self.trainable_tokens(self.model))

    def trainable_tokens(self, model):
        """peft `trainable_token_indices` for the embedding rows of the tokens the recipe added."""
        from recipeforge.components.vocab import trainable_tokens

        return trainable_tokens(model, getattr(self, "vocab", None), tuple(self.recipe.adapter.modules_to_save))

    def callbacks(self) -> list:
        """Metrics, tensorboard, the divergence watch (`stages.divergence`), plus any from the context.
        (Checkpoints are staged, marked complete and published by the trainer itself:
        `outputs.atomic.crash_safe`.)"""
        from recipeforge.outputs import metrics

        writer = metrics.MetricsWriter(self.ctx.run.metrics, enabled=self.ctx.dist.is_main)
        from recipeforge.stages.device_memory import peak_memory_source

        memory = peak_memory_source(self.ctx.plan.device)
        sources = [*self.extra_log_sources, self.token_rate, *([memory] if memory else [])]
        cbs = [metrics.make_callback(writer, sources)]
        if self.recipe.train.scheduler == "wsd":
            from recipeforge.components.schedules import wsd_callback

            cbs.append(wsd_callback(self.recipe.train.decay_ratio))
        if self.recipe.logging.tensorboard and self.ctx.dist.is_main:
            cbs.append(_tensorboard_callback(self.ctx.run.tensorboard))
        from recipeforge.stages.divergence import make_callback as divergence_callback

        cbs.append(divergence_callback(self.recipe.train.divergence, stage=self.recipe.stage,
                                       checkpoints=self.ctx.run.checkpoints, log=self.ctx.log))
        from recipeforge.stages.preemption import make_callback as stop_on_signal

        cbs.append(stop_on_signal(self.ctx.run.checkpoints, self.ctx.resume_from))  # SIGTERM: save, stop
        from recipeforge.outputs.trackers import tracker_callbacks

        wandb = self.recipe.logging.wandb
        self.trackers = tracker_callbacks(
            self.recipe, self.ctx.run, run_name=self._run_name(), is_main=self.ctx.dist.is_main,
            wandb_name=(public(self.ctx.loaded, ("logging", "wandb", "name"), wandb.name) if wandb else None)
            or self.ctx.run.root.name, locate=self.ctx.locate)
        return cbs + self.trackers + list(self.ctx.callbacks)

    def training_arguments(self, cls, **stage_kwargs):
        """Build `cls` (TrainingArguments or a TRL config): common settings, then the stage's, then
        the backend's — the single place where backend trainer arguments are merged."""
        kwargs = {**self.common_arguments(), **stage_kwargs, **self.ctx.backend_kwargs}
        if self.recipe.train.activation_offloading:
            from recipeforge.stages.activation_offload import trainer_field

            kwargs.update(trainer_field(cls))  # TRL's configs; the plain Trainer's step is wrapped instead
        if "pad_to_multiple_of" in getattr(cls, "__dataclass_fields__", {}) and "pad_to_multiple_of" not in kwargs:
            from recipeforge.components.collate import pad_multiple

            kwargs["pad_to_multiple_of"] = pad_multiple(self.ctx.plan.device)  # TRL configs pad themselves
        try:
            return cls(**kwargs)
        except ValueError as exc:  # a combination the trainer refuses, e.g. batch sizes for GRPO
            raise RecipeError(f"the trainer rejected the settings: {str(exc).splitlines()[0]}") from None

    def common_arguments(self) -> dict:
        r, plan, run = self.recipe, self.ctx.plan, self.ctx.run
        t, o = r.train, r.output
        if t.optimizer in BNB_OPTIMIZERS:
            from recipeforge.components.adapters import check_bitsandbytes

            check_bitsandbytes(plan.device, what=f"optimizer {t.optimizer}", key="train.optimizer",
                               location=self.ctx.locate(("train", "optimizer")))
        scheduler, sched_kwargs = SCHEDULERS[t.scheduler]
        warmup: float = t.warmup_steps if t.warmup_steps is not None else min(t.warmup_ratio, 0.999)
        on_cpu = plan.device != "cuda"
        from recipeforge.components.models import resolve_dtype
        from recipeforge.stages.precision import cuda_capability, tf32_argument

        dtype = resolve_dtype(r.model.dtype, plan.device)
        eval_strategy = ("steps" if t.eval_steps else "epoch") if self.has_eval else "no"
        kwargs: dict[str, Any] = dict(
            output_dir=str(run.checkpoints),
            per_device_train_batch_size=plan.micro_batch_size,
            per_device_eval_batch_size=plan.micro_batch_size,
            gradient_accumulation_steps=plan.gradient_accumulation,
            num_train_epochs=t.epochs or 1.0,
            max_steps=t.max_steps or -1,
            learning_rate=t.learning_rate,
            lr_scheduler_type=scheduler,
            lr_scheduler_kwargs=sched_kwargs or None,
            warmup_steps=warmup,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            max_grad_norm=t.max_grad_norm or 0.0,
            optim=OPTIMIZERS[t.optimizer],
            seed=t.seed,
            data_seed=t.seed,
            logging_steps=t.logging_steps,
            logging_first_step=True,
            logging_nan_inf_filter=False,  # a NaN loss must show (and stop the run), not be averaged away
            eval_strategy=eval_strategy,
            eval_steps=t.eval_steps,
            save_strategy="steps" if o.save_steps else "epoch",
            save_steps=o.save_steps or 500,
            save_total_limit=o.save_total_limit,
            load_best_model_at_end=t.load_best_model_at_end,
            metric_for_best_model=t.metric_for_best_model if t.load_best_model_at_end else None,
            # Trackers are recipeforge's callbacks (`outputs.trackers`): the trainer never starts one
            # by itself, whatever is installed.
            report_to="none",
            run_name=self._run_name(),
            disable_tqdm=True,  # the progress line of `outputs.console` replaces the trainer's bar
            use_cpu=on_cpu,
            # Mixed precision only on GPUs; TRL configs default bf16=True, which CPUs refuse.
            bf16=not on_cpu and str(dtype) == "torch.bfloat16",
            fp16=not on_cpu and str(dtype) == "torch.float16",
            # TF32 matmuls on Ampere or newer (`train.tf32`); None leaves torch's default
            tf32=tf32_argument(t.tf32, plan.device, cuda_capability() if not on_cpu else None),
            # The same bound on collective waits as the process group (accelerate would otherwise
            # initialise one with its own default when it starts the group itself).
            ddp_timeout=max(1, math.ceil(r.distributed.timeout_minutes * 60)),
            dataloader_num_workers=0,
            train_sampling_strategy="random" if r.data.shuffle else "sequential",
            push_to_hub=False,
        )
        # transformers 5 renamed the switch (the old name still works, with a warning).
        from transformers import TrainingArguments

        ckpt = "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ \
            else "gradient_checkpointing"
        kwargs[ckpt] = bool(plan.gradient_checkpointing)
        kwargs.update(self.kernels.trainer_kwargs)
        return kwargs

    def frozen_reference(self, name: str):
        """The frozen reference model of a preference stage: None when TRL derives it (adapters: the
        base with adapters disabled), else the starting model loaded again (`auto`), or the model
        `<stage>.reference` names."""
        if name == "auto":
            if self.recipe.adapter.type != "none":
                return None
            # Same name and seed: for tiny models an identical random init, else the same checkpoint.
            ref = self.load_model(for_reference=True)
        else:
            from recipeforge.components.models import load_model

            m = self.recipe.model
            ref = load_model(name, self.tokenizer, device=self.ctx.plan.device, dtype=m.dtype,
                             attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code,
                             seed=self.recipe.train.seed, location=self.ctx.locate((self.stage, "reference")))
        ref.requires_grad_(False)
        return ref.eval()

    def _run_name(self) -> str | None:
        """The run's name for trackers and training_args.bin: never one read from a secret variable."""
        r = self.recipe
        return public(self.ctx.loaded, ("name",), r.name) \
            or (self.ctx.loaded.path.stem if getattr(self.ctx.loaded, "path", None) else None)

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


def _tensorboard_callback(log_dir: Path):
    from transformers.integrations import TensorBoardCallback

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise RecipeError("logging.tensorboard needs the tensorboard package, which is not installed",
                          key="logging.tensorboard", hint="pip install 'recipeforge[tensorboard]'") from None
    log_dir.mkdir(parents=True, exist_ok=True)
    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))
