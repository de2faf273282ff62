"""A recipe reduced to the numbers the memory model needs (`Workload`).

This is the only planner module that reads recipe fields for sizing; the memory formulas in
`memory.py` see numbers only, so they can be tested against published figures directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recipeforge.plan.expert_lora import expert_lora_linears, experts_adapted
from recipeforge.plan.hardware import Hardware
from recipeforge.plan.linear import Linear
from recipeforge.plan.models import ModelSpec
from recipeforge.plan.stage_shape import Rollout, stage_shape
from recipeforge.plan.teacher import Teacher
from recipeforge.plan.vision_stages import refuse_what_a_vlm_cannot_train
from recipeforge.plan.vision_workload import VisionLoad, build_vision_load

if TYPE_CHECKING:
    from recipeforge.config.schema.adapter import AdapterConfig
    from recipeforge.config.schema.recipe import Recipe

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Target-module names used by the architectures the planner knows, mapped to the canonical
# projection names of `ModelSpec.layer_linears()` (fused modules map to all their parts).
_TARGET_ALIASES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"), "c_attn": ("q_proj", "k_proj", "v_proj"),
    "query_key_value": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
    "c_fc": ("up_proj",), "fc1": ("up_proj",), "fc2": ("down_proj",), "dense": ("o_proj",),
    "c_proj": ("o_proj", "down_proj"), "out_proj": ("o_proj",), "w1": ("experts.gate_proj",),
    "w3": ("experts.up_proj",), "w2": ("experts.down_proj",),
}


@dataclass(frozen=True)
class Workload:
    """What one training step holds in memory, independent of the distributed layout."""

    model: ModelSpec
    stage: str
    dtype: str                        # resolved: bf16 | fp16 | fp32
    adapter: str                      # none | lora | qlora
    optimizer: str
    attention: str                    # fused (flash/sdpa/flex) | eager
    seq_len: int                      # tokens per sequence through the model
    logit_tokens: int                 # tokens per sequence that produce logits (GRPO: the completion)
    sequences_per_sample: int = 1     # DPO: chosen + rejected
    lora_rank: int = 0
    lora_linears: tuple[Linear, ...] = ()
    lora_dropout: float = 0.0
    lora_dora: bool = False
    modules_to_save_params: int = 0
    quant_bits: int = 4
    double_quant: bool = True
    reference_model: bool = False     # a frozen copy of the policy (DPO / GRPO with beta > 0, full fine-tune)
    rollout: Rollout | None = None
    teacher: Teacher | None = None    # distill: the teacher, colocated or served (`plan.teacher`)
    fused_loss: bool = False          # liger: fused linear + cross-entropy, no full logits
    fused_kernels: bool = False       # liger: fused RMSNorm / SwiGLU
    activation_offloading: bool = False  # train.activation_offloading on a GPU (plan.offload_activations)
    fp32_master: bool = False         # full fine-tune on single/ddp: fp32 weights under 16-bit autocast
    fp8_layer_params: int = 0         # train.precision fp8: weights per decoder layer in float8 matmuls (`plan.fp8`)
    fp8_gather: bool = False          # ... and FSDP2 all-gathers them in float8
    optimizer_in_backward: bool = False  # train.optimizer_in_backward (`plan.optim_in_backward`)
    unfrozen_params: int | None = None  # train.unfrozen_parameters: the selected parameters (None: all)
    unfrozen_kinds: frozenset[str] | None = None  # the kinds of weight they are (`unfrozen.unfrozen_kinds`)
    attn_implementation: str = "auto"  # the recipe's model.attn_implementation (context parallel needs sdpa)
    packing: bool = False             # data.packing (context parallel cannot mask packed samples apart)
    attention_mask: bool = False      # sdpa with a dense mask in every layer (packed rows; `sdpa_masks_packed_rows`)
    checkpoint_mode: str = "full"     # with checkpointing: "full" or "selective" (train.gradient_checkpointing)
    checkpoint_every: int = 1         # full checkpointing of every N-th layer (train.checkpoint_every)
    vision: VisionLoad | None = None  # a vision-language model's images and what of its vision side trains
    # Backends that recipe settings outside the capability record rule out: (backend, key, message).
    setting_refusals: tuple[tuple[str, str, str], ...] = ()
    # Keys of methods that swap whole linear layers (`plan.whole_linears`): train.qat, train.precision fp8.
    whole_linears: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def compute_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def full_finetune(self) -> bool:
        return self.adapter == "none"

    @property
    def linears_train(self) -> bool:
        """Whether projection weights train (and so keep their inputs for their weight gradients)."""
        return self.full_finetune and (self.unfrozen_kinds is None or "linear" in self.unfrozen_kinds)

    @property
    def norms_train(self) -> bool:
        """Whether norm weights train (and so keep their normalised tensor)."""
        return self.full_finetune and (self.unfrozen_kinds is None or "norm" in self.unfrozen_kinds)

    def lora_params(self) -> int:
        """Adapter parameters: r * (in + out) per targeted linear, in every layer (plus DoRA magnitudes)."""
        per_layer = sum(lin.count * self.lora_rank * (lin.in_features + lin.out_features) for lin in self.lora_linears)
        if self.lora_dora:
            per_layer += sum(lin.count * lin.out_features for lin in self.lora_linears)
        return self.model.num_layers * per_layer

    def trainable_params(self) -> int:
        """Parameters with gradients and optimizer states. A vision tower and projector train only
        where `model.vision` says so (train.unfrozen_parameters selects among the language model's)."""
        vision = self.vision
        if self.full_finetune:
            text = self.model.text_params() if self.unfrozen_params is None else self.unfrozen_params
            return text + (vision.full_trainable_params() if vision else 0)
        adapters = vision.adapter_params(self.lora_rank, self.lora_dora) if vision else 0
        return self.lora_params() + self.modules_to_save_params + adapters


def resolve_dtype(dtype: str, hardware: Hardware) -> str:
    """`auto`: bf16 on GPUs that support it, fp16 on older GPUs, fp32 on CPU."""
    if dtype != "auto":
        return dtype
    if hardware.device == "cpu":
        return "fp32"
    assert hardware.accelerator is not None  # a GPU target has one (`Hardware.device`)
    return "bf16" if hardware.accelerator.bf16 else "fp16"


def lora_targets(model: ModelSpec, target_modules: str | tuple[str, ...]) -> tuple[Linear, ...]:
    """The decoder linears a LoRA `target_modules` setting reaches. ``all-linear`` follows peft: every
    nn.Linear in the decoder layers (MoE experts are fused 3-D weights in transformers 5, so not)."""
    linears = model.layer_linears()
    if target_modules == "all-linear":  # routers and routed experts are no nn.Linear in transformers 5
        return tuple(model.nn_linears())
    wanted: set[str] = set()
    for name in target_modules:
        short = name.rsplit(".", 1)[-1]
        wanted.update(_TARGET_ALIASES.get(short, (short,)))
    # A short name reaches dense and shared-expert projections; routed experts only by their own names.
    def reached(lin: Linear) -> bool:
        short = lin.name.rsplit(".", 1)[-1]
        return lin.name in wanted or (not lin.name.startswith("experts.") and short in wanted)

    return tuple(lin for lin in linears if reached(lin))


def build_workload(recipe: Recipe, model: ModelSpec, hardware: Hardware, planners: Mapping[str, Any]) -> Workload:
    """The `Workload` of `recipe` on `hardware` for the model `model`; the settings a backend refuses
    come from the backend specs of `planners` (`plan.planners.Planners`: name -> spec). Refuses first what
    a vision-language model cannot be trained with."""
    if model.vision is not None:
        refuse_what_a_vlm_cannot_train(recipe)
    notes: list[str] = list(model.notes)
    dtype = resolve_dtype(recipe.model.dtype, hardware)
    adapter = recipe.adapter
    attention = "eager" if recipe.model.attn_implementation == "eager" else "fused"
    masked = attention == "fused" and sdpa_masks_packed_rows(recipe.model.attn_implementation,
                                                             bool(recipe.data.packing), hardware.device)
    shape = stage_shape(recipe, model, notes)
    model = shape.model
    lora_linears, save_params = _adapter_params(model, adapter, notes)
    if experts_adapted(recipe):  # MoE: peft's per-expert adapters on the fused expert weights (`plan.experts`)
        lora_linears += expert_lora_linears(model)
    unfrozen = _unfrozen_params(recipe, model, notes)
    kinds = None
    if unfrozen is not None:
        from recipeforge.plan.unfrozen import unfrozen_kinds

        assert recipe.train.unfrozen_parameters is not None  # `_unfrozen_params` counts them only when set
        kinds = unfrozen_kinds(model, list(recipe.train.unfrozen_parameters))
    fused_loss, fused_kernels = _liger_flags(recipe, model)
    if fused_loss and shape.teacher is not None:
        fused_loss = False
        notes.append("liger's fused linear cross-entropy does not apply to distillation: its loss reads the "
                     "student's full-vocabulary log-probabilities, so the logits are sized in full")
    vision = _vision_load(recipe, model, shape.seq_len, notes)
    return Workload(
        model=model, stage=recipe.stage, dtype=dtype, adapter=adapter.type, optimizer=recipe.train.optimizer,
        attention=attention, seq_len=shape.seq_len, logit_tokens=shape.logit_tokens,
        sequences_per_sample=shape.sequences_per_sample,
        lora_rank=adapter.r if adapter.type != "none" else 0, lora_linears=lora_linears,
        lora_dropout=adapter.dropout, lora_dora=adapter.use_dora, modules_to_save_params=save_params,
        quant_bits=adapter.quant.bits, double_quant=adapter.quant.double_quant,
        reference_model=shape.reference_model,
        rollout=shape.rollout, teacher=shape.teacher, fused_loss=fused_loss, fused_kernels=fused_kernels, notes=tuple(notes),
        attn_implementation=recipe.model.attn_implementation, packing=bool(recipe.data.packing),
        attention_mask=masked,
        setting_refusals=_setting_refusals(recipe, planners), whole_linears=recipe.train.linear_swap_keys(),
        unfrozen_params=unfrozen, unfrozen_kinds=kinds,
        activation_offloading=recipe.train.activation_offloading and hardware.device == "cuda",
        checkpoint_mode="selective" if recipe.train.gradient_checkpointing == "selective" else "full",
        checkpoint_every=recipe.train.checkpoint_every, vision=vision,
        optimizer_in_backward=recipe.train.optimizer_in_backward)


def _vision_load(recipe: Recipe, model: ModelSpec, seq_len: int, notes: list[str]) -> VisionLoad | None:
    """The recipe's images for a vision-language model (None for a text-only one). Image tokens are
    part of the text sequence (the processor expands each image into its tokens in input_ids), so
    data.sequence_len bounds text and image tokens together: the language model's terms stay sized
    at sequence_len, and images that alone fill it leave no room for text."""
    if model.vision is None:
        return None
    load = build_vision_load(recipe.model.vision, model.vision, recipe.adapter, notes)
    if load.image_tokens_per_sample >= seq_len:
        notes.append(f"{load.images_per_sample} image(s) of {load.image.llm_tokens} tokens fill the whole "
                     f"{seq_len}-token sequence (data.sequence_len counts image tokens): raise data.sequence_len "
                     "or lower model.vision.max_pixels")
    return load


def _adapter_params(model: ModelSpec, adapter: AdapterConfig, notes: list[str]) -> tuple[tuple[Linear, ...], int]:
    """The linears a LoRA adapter targets and the parameters its `modules_to_save` train in full."""
    lora_linears: tuple[Linear, ...] = ()
    save_params = 0
    if adapter.type != "none":
        lora_linears = lora_targets(model, adapter.target_modules)
        if not lora_linears:
            notes.append(f"adapter.target_modules {list(adapter.target_modules)} matched no known projection "
                         f"of {model.model_type}; the adapter is counted as empty")
        for name in adapter.modules_to_save:
            short = name.rsplit(".", 1)[-1]
            head = short in ("lm_head", "embed_out")
            if short in ("embed_tokens", "wte", "embed_in") or head and not model.num_labels:
                save_params += model.vocab_size * model.hidden_size
        if model.num_labels:
            save_params += model.head_params()  # the new score head trains in full next to the adapters
    return lora_linears, save_params


def _unfrozen_params(recipe: Recipe, model: ModelSpec, notes: list[str]) -> int | None:
    """The parameters train.unfrozen_parameters selects (None: all of them train)."""
    if not recipe.train.unfrozen_parameters:
        return None
    from recipeforge.plan.unfrozen import check_adapter, unfrozen_count

    check_adapter(recipe.train.unfrozen_parameters, recipe.adapter.type)
    unfrozen, found = unfrozen_count(model, list(recipe.train.unfrozen_parameters))
    notes.extend(found)
    return unfrozen


def _liger_flags(recipe: Recipe, model: ModelSpec) -> tuple[bool, bool]:
    """(fused_loss, fused_kernels) from the recipe's liger kernel settings."""
    liger = recipe.kernels.get("liger")
    fused_loss = liger is not None and liger.get("fused_linear_cross_entropy") is not False \
        and not liger.get("cross_entropy") and not model.num_labels  # a score head has no cross-entropy
    fused_kernels = liger is not None and not (liger.get("rms_norm") is False and liger.get("swiglu") is False)
    return fused_loss, fused_kernels


def sdpa_masks_packed_rows(attn_implementation: str, packing: bool, device: str) -> bool:
    """Whether attention runs as sdpa with a dense mask. Packed rows carry position ids that restart
    for every sample, from which transformers builds a block-diagonal boolean mask for sdpa (flash
    attention takes the sample boundaries instead, flex attention a block mask). `auto` is sdpa on
    the CPU and flash attention on a GPU that has it installed, as the run resolves it
    (`components.models.resolve_attn_implementation`); the plan assumes it is installed there."""
    sdpa = attn_implementation == "sdpa" or (attn_implementation == "auto" and device != "cuda")
    return sdpa and packing


def _setting_refusals(recipe: Recipe, planners: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(backend, key, message) for each recipe setting a backend cannot honour beyond its capability
    record (`PlannerSpec.recipe_refusals`), so `auto` never plans a layout that validation or
    `check()` would refuse."""
    return tuple((name, key, message) for name, spec in planners.items()
                 for key, message in spec.recipe_refusals(recipe))


