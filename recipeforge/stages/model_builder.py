"""Loading the model a stage trains: full, LoRA or QLoRA, from a checkpoint or random init, whole or
sharded by the backend, with the recipe's added tokens and unfrozen parameters.

A `ModelBuilder` is made once per run from the stage context, the tokenizer and what the tokenizer
step added to the vocabulary (`components.vocab`); the stage asks it for the base model, the frozen
reference copy of a preference stage, and LoRA on top when the stage (not its trainer) adds it.
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recipeforge.stages.context import StageContext


class ModelBuilder:
    """Builds the model of one run (see the module docstring).

    `num_labels`: outputs of a sequence-classification head (reward models), None for the LM head.
    `base_on_disk`: whether the trainer loads the starting model again by its name (a reference
    model, a rollout engine with its own copy), so a random-init base must be written to base_model/.
    """

    def __init__(self, ctx: "StageContext", tokenizer: Any, vocab: Any = None, *, num_labels: int | None = None,
                 base_on_disk: bool = False, processor: Any = None):
        self.ctx = ctx
        self.tokenizer = tokenizer
        # What is written next to weights (base_model/): a VLM's processor (tokenizer, image processor
        # and chat template), else the tokenizer.
        self.files = processor if processor is not None else tokenizer
        self.vocab = vocab
        self.num_labels = num_labels
        self.base_on_disk = base_on_disk

    def base(self, *, for_reference: bool = False) -> Any:
        """The base model, quantized for QLoRA; adapters are added by `with_lora` or by the trainer.
        `for_reference`: a second, frozen copy (never sharded, never written, no fp32 masters)."""
        from recipeforge.components.adapters import prepare_quantized
        from recipeforge.components.tiny_spec import tiny_arch

        plan, m = self.ctx.plan, self.ctx.recipe.model
        common, quant = self._load_arguments(for_reference)
        random_init = tiny_arch(m.name_or_path) is not None or m.init == "random"
        if self.ctx.load_sharded is not None and not for_reference:
            model = self._load_sharded(m.name_or_path, common, random_init)
            if quant is not None:  # a 4-bit base the backend loads its own way (`backends.quantized_loading`)
                model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing,
                                          device=plan.device, sharded=True)
            return model
        if m.init == "random" and tiny_arch(m.name_or_path) is None:
            from recipeforge.plan.catalog import architecture_config

            common["random_config"] = architecture_config(m.name_or_path, m.revision)
        if random_init and (self.ctx.recipe.adapter.type != "none" or self.base_on_disk) and not for_reference:
            model = self._random_base_kept(common, quant)
        else:
            from recipeforge.components.models import load_model

            model = load_model(m.name_or_path, self.tokenizer, **{**common, "quantization_config": quant})
        if quant is not None:
            model = prepare_quantized(model, gradient_checkpointing=plan.gradient_checkpointing, device=plan.device,
                                      sharded=self.sharded_trainable_dtype() is not None)
        return model

    def _load_arguments(self, for_reference: bool) -> tuple[dict[str, Any], Any]:
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

    def _random_base_kept(self, common: dict[str, Any], quant: Any) -> Any:
        """A random-init base that exists nowhere else: kept next to the adapter (merging needs it; a
        trainer building its own reference model loads it), and loaded from there when it has to be
        quantized."""
        from recipeforge.components.models import load_model
        from recipeforge.outputs.export import save_base_model

        run = self.ctx.run
        started = time.perf_counter()
        base = load_model(self.ctx.recipe.model.name_or_path, self.tokenizer, **common)
        built = time.perf_counter()
        if self.ctx.dist.is_main:
            save_base_model(base, self.files, run.base_model)
            self.ctx.log(f"model: random init in {built - started:.1f}s, written to {run.base_model} in "
                         f"{time.perf_counter() - built:.1f}s")
        if quant is not None:
            # Every rank loads the 4-bit base from the folder the first rank just wrote.
            self.ctx.barrier()
            base = load_model(str(run.base_model), self.tokenizer,
                              **{**common, "random_config": None, "quantization_config": quant})
        base.config._name_or_path = str(run.base_model.resolve())
        # peft writes the adapter's base_model_name_or_path from this attribute (set only at
        # construction): with it, final/ loads through transformers' Auto classes on its own.
        base.name_or_path = base.config._name_or_path
        return base

    def _load_sharded(self, name: str, common: dict[str, Any], random_init: bool) -> Any:
        """The model loaded sharded by the backend's loader. A random-init model is written to
        base_model/ first (by the main process), since a sharded load reads a checkpoint."""
        from recipeforge.components.models import load_model, resolve_attn_implementation, resolve_dtype
        from recipeforge.outputs.export import save_base_model

        assert self.ctx.load_sharded is not None
        path = name
        if random_init:
            if self.ctx.dist.is_main:
                save_base_model(load_model(name, self.tokenizer, **common), self.files, self.ctx.run.base_model)
            self.ctx.barrier()
            path = str(self.ctx.run.base_model.resolve())
        return self.ctx.load_sharded(path, dtype=resolve_dtype(common["dtype"], common["device"]),
                                     attn_implementation=resolve_attn_implementation(
                                         common["attn_implementation"], common["device"]),
                                     revision=None if random_init else common["revision"],
                                     trust_remote_code=common["trust_remote_code"])

    def sharded_trainable_dtype(self) -> Any:
        """The one dtype of every trainable parameter when a QLoRA base is partitioned like any other
        weights (ZeRO-3, FSDP: its 4-bit weights are stored in the compute dtype and nothing is upcast,
        `components.adapters`), else None. fp32 under a GPU's mixed precision (FSDP computes in 16 bits
        through its policy, DeepSpeed through its own cast); on a CPU, which has no mixed precision,
        the compute dtype the 16-bit activations arrive in."""
        from recipeforge.components.models import resolve_dtype
        from recipeforge.plan.memory import spec_of

        plan, dtype = self.ctx.plan, self.ctx.recipe.model.dtype
        if self.ctx.recipe.adapter.type != "qlora" or not spec_of(plan.backend).plan_shards_weights(plan):
            return None
        if plan.device == "cuda":
            return resolve_dtype("fp32", plan.device)
        resolved = resolve_dtype(dtype, plan.device)
        return resolve_dtype("bf16", plan.device) if str(resolved) == "torch.float32" else resolved

    def with_lora(self, model: Any) -> Any:
        """`model` with the recipe's LoRA adapters (for stages that add them before the trainer)."""
        from recipeforge.components.adapters import apply_lora

        r = self.ctx.recipe
        return apply_lora(model, r.adapter, seed=r.train.seed, gradient_checkpointing=self.ctx.plan.gradient_checkpointing,
                          trainable_dtype=self.sharded_trainable_dtype(), trainable_tokens=self.trainable_tokens(model),
                          target_modules=self.lora_targets(model))

    def lora_targets(self, model: Any) -> Any:
        """The modules LoRA adapts when the recipe's names need the model to resolve: a vision-language
        model's language side (`components.vision_model.lora_targets`); None otherwise."""
        from recipeforge.components.vision_model import is_vision_model, lora_targets

        if not is_vision_model(model):
            return None
        r = self.ctx.recipe
        return lora_targets(model, r.adapter, r.model.vision, location=self.ctx.locate(("adapter", "target_modules")))

    def trainable_tokens(self, model: Any) -> Any:
        """peft `trainable_token_indices` for the embedding rows of the tokens the recipe added."""
        from recipeforge.components.vocab import trainable_tokens

        return trainable_tokens(model, self.vocab, tuple(self.ctx.recipe.adapter.modules_to_save))

    def reference(self, name: str, *, location: Any = None) -> Any:
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

