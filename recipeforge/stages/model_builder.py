"""Loading the model a stage trains: full, LoRA or QLoRA, from a checkpoint or random init, whole or
sharded by the backend, with the recipe's added tokens and unfrozen parameters.

A `ModelBuilder` is made once per run from the stage context, the tokenizer and what the tokenizer
step added to the vocabulary (`components.vocab`); the stage asks it for the base model, the frozen
reference copy of a preference stage, and LoRA on top when the stage (not its trainer) adds it.
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING, Any

from recipeforge.errors import Location

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel
    from transformers import (BitsAndBytesConfig, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase,
                              ProcessorMixin, TrainerCallback, TrainerControl, TrainerState, TrainingArguments)

    from recipeforge.components.model_init import RandomInit
    from recipeforge.components.vocab import VocabChange
    from recipeforge.stages.context import StageContext


class ModelBuilder:
    """Builds the model of one run (see the module docstring).

    `num_labels`: outputs of a sequence-classification head (reward models), None for the LM head.
    `base_on_disk`: whether the trainer loads the starting model again by its name (a reference
    model, a rollout engine with its own copy), so a random-init base must be written to base_model/
    before training.
    """

    def __init__(self, ctx: StageContext, tokenizer: PreTrainedTokenizerBase, vocab: VocabChange | None = None, *,
                 num_labels: int | None = None, base_on_disk: bool = False, processor: ProcessorMixin | None = None):
        self.ctx = ctx
        self.tokenizer = tokenizer
        # What is written next to weights (base_model/): a VLM's processor (tokenizer, image processor
        # and chat template), else the tokenizer.
        self.files = processor if processor is not None else tokenizer
        self.vocab = vocab
        self.num_labels = num_labels
        self.base_on_disk = base_on_disk
        # A random-init base to write to base_model/ when something reads it (`write_base`).
        self.pending_base: RandomInit | None = None
        self.base_written = False
        self.generation_config: GenerationConfig | None = None

    def base(self, *, for_reference: bool = False) -> PreTrainedModel:
        """The base model, quantized for QLoRA; adapters are added by `with_lora` or by the trainer.
        `for_reference`: a second, frozen copy (never sharded, never written, no fp32 masters).

        A random-init model is made where it trains, module by module (`components.model_init`):
        whole on this process's device, or shard by shard by a backend that makes it so. Its base is
        written to base_model/ only when something reads it: before training when the trainer loads
        it by path (`base_on_disk`), else, for an adapter run, at the first save (`write_base`)."""
        from recipeforge.components.adapters import prepare_quantized

        plan, m = self.ctx.plan, self.ctx.recipe.model
        common, quant = self._load_arguments(for_reference)
        spec = self.random_spec(common)
        if self.ctx.load_sharded is not None and not for_reference:
            model = self._load_sharded(m.name_or_path, common, spec)
            if quant is not None:  # a 4-bit base the backend loads its own way (`backends.sharded_loading`)
                model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing,
                                          device=plan.device, sharded=True)
        else:
            if spec is not None:
                from recipeforge.components.models import build_random
                from recipeforge.components.vocab import fit_model

                started = time.perf_counter()
                model = build_random(spec, self.tokenizer, name=m.name_or_path, device=plan.device,
                                     quantization_config=quant)
                fit_model(model, self.tokenizer, self.vocab)
                self.ctx.log(f"model: random init on {plan.device} in {time.perf_counter() - started:.1f}s")
            else:
                from recipeforge.components.models import load_model

                model = load_model(m.name_or_path, self.tokenizer, **{**common, "quantization_config": quant})
            if quant is not None:
                model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing,
                                          device=plan.device, sharded=self.sharded_trainable_dtype() is not None)
        if spec is not None and not for_reference:
            self._keep_base(model, spec)
        return model

    def random_spec(self, common: dict[str, Any]) -> RandomInit | None:
        """The `components.model_init.RandomInit` of a random-init run (a ``tiny:*`` model or
        `model.init: random`), or None when the model is loaded from weights."""
        from recipeforge.components.models import random_init_spec, resolve_attn_implementation, resolve_dtype
        from recipeforge.components.tiny_spec import tiny_arch

        m = self.ctx.recipe.model
        if m.init != "random" and tiny_arch(m.name_or_path) is None:
            return None
        random_config = None
        if tiny_arch(m.name_or_path) is None:
            from recipeforge.plan.catalog import architecture_config

            random_config = architecture_config(m.name_or_path, m.revision)
        device = common["device"]
        spec: RandomInit | None = random_init_spec(
            m.name_or_path, self.tokenizer, dtype=resolve_dtype(common["dtype"], device),
            attn_implementation=resolve_attn_implementation(common["attn_implementation"], device),
            seed=common["seed"], max_position_embeddings=common["max_position_embeddings"],
            num_labels=common.get("num_labels"), random_config=random_config,
            new_rows=tuple(self.vocab.new_ids) if self.vocab else (), location=common["location"])
        return spec

    def _keep_base(self, model: PreTrainedModel, spec: RandomInit) -> None:
        """A random-init base exists nowhere else: an adapter run names base_model/ as its base (peft
        writes the adapter's base_model_name_or_path from the model's name), written when the trainer
        loads it by path (now), else at the first save."""
        run = self.ctx.run
        if self.ctx.recipe.adapter.type == "none" and not self.base_on_disk:
            return
        if self.pending_base is None and not self.base_written:
            self.pending_base = spec
        model.config._name_or_path = str(run.base_model.resolve())
        # Set only at construction: with it, final/ loads through transformers' Auto classes on its own.
        model.name_or_path = model.config._name_or_path
        self.generation_config = getattr(model, "generation_config", None)
        if self.base_on_disk:
            self.write_base()  # the trainer loads it by path; every rank waits for it (`TrainerStage.setup`)

    def write_base(self) -> None:
        """Write a random-init base not yet written to base_model/ (the main process; the weights made
        again one module at a time, `outputs.weights.write_random_base`). Called before the first
        checkpoint and final/ are written (`save_callback`, the stage's `save`)."""
        spec, self.pending_base = self.pending_base, None
        if spec is None or not self.ctx.dist.is_main:
            return
        from recipeforge.components.models import training_device
        from recipeforge.outputs.weights import write_random_base

        started = time.perf_counter()
        write_random_base(spec, self.files, self.ctx.run.base_model, device=training_device(self.ctx.plan.device),
                          tokenizer=self.tokenizer, generation_config=self.generation_config)
        self.base_written = True
        self.ctx.log(f"model: random-init base written to {self.ctx.run.base_model} in "
                     f"{time.perf_counter() - started:.1f}s")

    def save_callback(self) -> TrainerCallback | None:
        """A trainer callback writing the pending base (`write_base`) right before the first checkpoint
        is saved (the step's end decided it), so that the checkpoint's adapter has its base when peft
        writes it; None when no base is pending."""
        if self.pending_base is None:
            return None
        from transformers import TrainerCallback

        builder = self

        class WriteBaseBeforeSave(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here (`Any`)
            def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                            **kwargs: Any) -> None:
                if control.should_save:
                    builder.write_base()

        return WriteBaseBeforeSave()

    def _load_arguments(self, for_reference: bool) -> tuple[dict[str, Any], BitsAndBytesConfig | None]:
        """The keyword arguments of `components.models.load_model`, and the 4-bit/8-bit config (None
        unless QLoRA)."""
        from recipeforge.components.adapters import quantization_config
        from recipeforge.components.models import resolve_dtype
        from recipeforge.stages.precision import loads_fp32_masters

        r, plan = self.ctx.recipe, self.ctx.plan
        m, a = r.model, r.adapter
        quant, dtype = None, m.dtype
        if a.type == "qlora":
            if str(resolve_dtype(m.dtype, plan.device)) == "torch.float32":
                dtype = "bf16"  # `auto` on a CPU: 4-bit layers compute in bf16, not fp32
            quant = quantization_config(a, resolve_dtype(dtype, plan.device), plan.device,
                                        location=self.ctx.locate(("adapter", "type")))
        elif not for_reference and loads_fp32_masters(plan, a.type, str(resolve_dtype(m.dtype, plan.device))):
            dtype = "fp32"  # mixed precision: fp32 master weights under 16-bit autocast (`stages.precision`)
        common: dict[str, Any] = dict(
            device=plan.device, dtype=dtype, attn_implementation=m.attn_implementation, revision=m.revision,
            trust_remote_code=m.trust_remote_code, seed=r.train.seed, max_position_embeddings=m.max_position_embeddings,
            location=self.ctx.locate(("model", "name_or_path")), vocab=self.vocab)
        if self.num_labels is not None:  # a sequence-classification head instead of the LM head
            common["num_labels"] = self.num_labels
        return common, quant

    def _load_sharded(self, name: str, common: dict[str, Any], spec: RandomInit | None) -> PreTrainedModel:
        """The model loaded sharded by the backend's loader. A random-init model is made shard by
        shard by a backend that can (`WorkerHooks.makes_random`); for one that reads checkpoints only
        (tensor parallel) its base is written to base_model/ first, by the main process."""
        from recipeforge.components.models import resolve_attn_implementation, resolve_dtype

        assert self.ctx.load_sharded is not None
        path, extra = name, {}
        if spec is not None and self.ctx.hooks.makes_random:
            extra["random"] = spec
        elif spec is not None:
            self.pending_base = spec
            self.write_base()
            self.ctx.barrier()
            path = str(self.ctx.run.base_model.resolve())
        return self.ctx.load_sharded(path, dtype=resolve_dtype(common["dtype"], common["device"]),
                                     attn_implementation=resolve_attn_implementation(
                                         common["attn_implementation"], common["device"]),
                                     revision=None if spec is not None else common["revision"],
                                     trust_remote_code=common["trust_remote_code"], **extra)

    def sharded_trainable_dtype(self) -> torch.dtype | None:
        """The one dtype of every trainable parameter when a QLoRA base is partitioned like any other
        weights (ZeRO-3, FSDP: its 4-bit weights are stored in the compute dtype and nothing is upcast,
        `components.adapters`), else None. fp32 under a GPU's mixed precision (FSDP computes in 16 bits
        through its policy, DeepSpeed through its own cast); on a CPU, which has no mixed precision,
        the compute dtype the 16-bit activations arrive in."""
        from recipeforge.components.models import resolve_dtype

        plan, dtype = self.ctx.plan, self.ctx.recipe.model.dtype
        if self.ctx.recipe.adapter.type != "qlora" or not plan.traits.shards_weights:
            return None
        if plan.device == "cuda":
            fp32: torch.dtype = resolve_dtype("fp32", plan.device)
            return fp32
        resolved: torch.dtype = resolve_dtype(dtype, plan.device)
        return resolve_dtype("bf16", plan.device) if str(resolved) == "torch.float32" else resolved

    def with_lora(self, model: PreTrainedModel) -> PeftModel:
        """`model` with the recipe's LoRA adapters (for stages that add them before the trainer)."""
        from recipeforge.components.adapters import apply_lora

        r = self.ctx.recipe
        return apply_lora(model, r.adapter, seed=r.train.seed, gradient_checkpointing=self.ctx.plan.gradient_checkpointing,
                          trainable_dtype=self.sharded_trainable_dtype(), trainable_tokens=self.trainable_tokens(model),
                          target_modules=self.lora_targets(model), moe=self.moe_lora(model))

    def moe_lora(self, model: torch.nn.Module) -> Any:
        """The MoE part of the LoRA config (`components.moe.lora_plan`): experts targeted, routers kept
        out or trained in full; None for a dense model."""
        from recipeforge.components.moe import lora_plan

        r = self.ctx.recipe
        return lora_plan(model, r.moe, dropout=r.adapter.dropout, target_modules=r.adapter.target_modules,
                         location=self.ctx.locate(("adapter", "dropout")))

    def lora_targets(self, model: torch.nn.Module) -> list[str] | None:
        """The modules LoRA adapts when the recipe's names need the model to resolve: a vision-language
        model's language side (`components.vision_model.lora_targets`); None otherwise."""
        from recipeforge.components.vision_model import is_vision_model, lora_targets

        if not is_vision_model(model):
            return None
        r = self.ctx.recipe
        return lora_targets(model, r.adapter, r.model.vision, location=self.ctx.locate(("adapter", "target_modules")))

    def trainable_tokens(self, model: torch.nn.Module) -> dict[str, list[int]] | None:
        """peft `trainable_token_indices` for the embedding rows of the tokens the recipe added."""
        from recipeforge.components.vocab import trainable_tokens

        return trainable_tokens(model, self.vocab, tuple(self.ctx.recipe.adapter.modules_to_save))

    def lora_config(self, model: torch.nn.Module) -> LoraConfig | None:
        """The recipe's LoRA config for `model` (its added tokens' rows, a VLM's language-side targets,
        MoE experts), or None for full fine-tuning."""
        from recipeforge.components.adapters import lora_config

        adapter = self.ctx.recipe.adapter
        if adapter.type == "none":
            return None
        return lora_config(adapter, trainable_tokens=self.trainable_tokens(model),
                           target_modules=self.lora_targets(model), moe=self.moe_lora(model))

    def reference(self, name: str, *, location: Location | None = None) -> PreTrainedModel | None:
        """The frozen reference model of a preference stage: None when TRL derives it (adapters: the
        base with adapters disabled), else the starting model loaded again (`auto`; for tiny models an
        identical random init, same name and seed) or the model `name` names."""
        if name == "auto":
            if self.ctx.recipe.adapter.type != "none":
                return None
            ref = self.base(for_reference=True)
        else:
            from recipeforge.components.models import load_model

            m = self.ctx.recipe.model
            ref = load_model(name, self.tokenizer, device=self.ctx.plan.device, dtype=m.dtype,
                             attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code,
                             seed=self.ctx.recipe.train.seed, location=location)
        ref.requires_grad_(False)
        return ref.eval()

