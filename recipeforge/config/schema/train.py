"""`train:` — optimization: length, batch sizes, optimizer, schedule, precision knobs."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from recipeforge.components.fp8 import FP8_SCALINGS
from recipeforge.components.qat import QAT_SCHEMES
from recipeforge.config.param_patterns import parse_pattern
from recipeforge.config.schema.base import Section

Optimizer = Literal["adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
                    "adafactor", "sgd", "lion_8bit", "adamw_torchao_8bit", "adamw_torchao_4bit"]


def _valid_pattern(value: str) -> str:
    parse_pattern(value)  # ValueError: reported at the entry's own index
    return value


UnfrozenPattern = Annotated[str, AfterValidator(_valid_pattern)]
Scheduler = Literal["linear", "cosine", "cosine_with_min_lr", "constant", "constant_with_warmup", "wsd"]


class DivergenceConfig(Section):
    """Watching the logged loss for a run that has gone off the rails."""

    stop_on_nan: bool = Field(
        True, description="Stop at once when the loss or gradient norm is NaN or infinite (exit 2; the last "
                          "complete checkpoint is kept, nothing diverged is saved).")
    spike_factor: Optional[float] = Field(
        3.0, gt=1, description="A loss above this many times the median of the last `spike_window` logged losses "
                               "counts as a spike (null: no spike check). Positive losses only, so GRPO is exempt.")
    spike_window: int = Field(10, ge=2, description="Logged losses the running median is taken over.")
    spike_patience: int = Field(3, ge=1, description="Consecutive spiking logs before `on_spike` acts.")
    on_spike: Literal["warn", "stop"] = Field(
        "warn", description="`warn`: print a warning with the step; `stop`: end the run as for a NaN loss.")


class QATConfig(Section):
    """Quantization-aware training: torchao's fake quantization while training."""

    scheme: Literal[QAT_SCHEMES] = Field(
        description="What the forward pass sees quantized: `int4_weight`: the weights of every linear layer "
                    "but the output head rounded to int4 per group (symmetric, torchao's "
                    "`IntxWeightOnlyConfig`, what `recipeforge export --format torchao-int4` writes); "
                    "`int8_dynamic_act_int4_weight`: and their inputs to int8 per token (torchao's "
                    "`Int8DynamicActivationIntxWeightConfig`, what `export --format torchao-int8-int4` writes).")
    group_size: Literal[16, 32, 64, 128, 256] = Field(
        32, description="Input features sharing one int4 scale; must divide the input width of every linear "
                        "layer. `export --format torchao-int4` (or `torchao-int8-int4`) of the run uses the same "
                        "groups.")


class FP8Config(Section):
    """FP8 training settings (`train.precision: fp8`): torchao's float8 linear layers."""

    scaling: Literal[FP8_SCALINGS] = Field(
        "tensorwise", description="How the float8 casts are scaled: `tensorwise`: one dynamic scale per tensor "
                                  "(fastest, and FSDP2 can all-gather the weights in float8); `rowwise`: one "
                                  "power-of-2 scale per row (more accurate with outliers; needs "
                                  "`kernels.torch_compile` to be fast, torchao's own advice).")
    all_gather: bool = Field(
        True, description="With FSDP2 and `scaling: tensorwise`: all-gather the converted layers' weights in "
                          "float8 (half the bytes of bf16; one all-reduce of the scales after each optimizer "
                          "step). Ignored elsewhere: torchao supports it for tensorwise scaling only.")


class TrainConfig(Section):
    """How long and how to optimize."""

    epochs: Optional[float] = Field(1.0, gt=0, description="Passes over the training data (ignored when `max_steps` is set).")
    max_steps: Optional[int] = Field(None, gt=0, description="Total optimizer steps; overrides `epochs`.")
    global_batch_size: int = Field(
        32, gt=0, description="Sequences per optimizer step over all GPUs (micro batch x accumulation x data-parallel size).")
    micro_batch_size: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = Field(
        "auto", description="Sequences per GPU per forward pass; `auto` lets the planner choose what fits.")
    learning_rate: float = Field(2e-5, gt=0, lt=1, description="Peak learning rate.")
    optimizer: Optimizer = Field(
        "adamw", description="Optimizer. bitsandbytes' 8-bit/paged variants (`adamw_8bit`, `paged_*`, `lion_8bit`) "
                             "need the `qlora` extra; torchao's low-bit AdamW (`adamw_torchao_8bit`: two 8-bit "
                             "states, `adamw_torchao_4bit`: two 4-bit states, each with an fp32 scale per "
                             "256-value block) needs the `torchao` extra and also runs on the CPU.")
    scheduler: Scheduler = Field("cosine", description="Learning-rate schedule after warmup.")
    warmup_ratio: float = Field(0.03, ge=0, le=1, description="Share of steps with linear warmup.")
    warmup_steps: Optional[int] = Field(None, ge=0, description="Warmup steps; overrides `warmup_ratio`.")
    decay_ratio: float = Field(
        0.1, ge=0, le=1,
        description="`scheduler: wsd` only: share of all optimizer steps (from `max_steps`, or counted from "
                    "`epochs`) spent in the final cosine decay; warmup comes first, the stable peak in between.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="Adam beta1.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="Adam beta2.")
    max_grad_norm: Optional[float] = Field(1.0, gt=0, description="Gradient clipping norm (null: no clipping).")
    gradient_checkpointing: Union[Literal["auto", "selective"], bool] = Field(
        "auto", description="Recompute activations in the backward pass; `auto`: on when the planner needs the memory. "
                            "`true` checkpoints each decoder layer whole (its input kept, everything else recomputed); "
                            "`selective` keeps the outputs of the matrix multiplies (every second one) and of "
                            "attention and recomputes the rest (torch's selective activation checkpointing, "
                            "torchtitan's policy; Megatron's `recompute_granularity: selective`): less recomputation "
                            "for more memory.")
    checkpoint_every: int = Field(
        1, ge=1, description="With `gradient_checkpointing: true`: checkpoint every N-th decoder layer (layers 0, N, "
                             "2N, ...) and let the others keep their activations; 1 checkpoints every layer.")
    activation_offloading: bool = Field(
        False, description="Move the activations saved for backward to pinned host memory during the forward "
                           "pass and back for backward (TRL's activation offloading; GPU runs of pretrain, sft, "
                           "dpo, kto and reward). Frees the GPU of them at the cost of host RAM and PCIe traffic.")
    precision: Literal["auto", "mixed", "pure_bf16", "pure_bf16_sr", "fp8"] = Field(
        "auto", description="How full fine-tuning holds the trained weights on one GPU or DDP: `mixed` keeps "
                            "fp32 master weights and computes in `model.dtype` (autocast); `pure_bf16` keeps "
                            "weights, gradients and optimizer states in bf16 (half the memory, small updates "
                            "can round away); `pure_bf16_sr` adds stochastic rounding to the update (torchao's "
                            "AdamW, `pip install torchao`); `auto`: mixed when it fits, else pure bf16 (see "
                            "`recipeforge plan`). Sharded backends and adapters always keep fp32 masters. "
                            "`fp8`: mixed precision as above (fp32 master weights, gradients and optimizer "
                            "states; bf16 compute) with the matmuls of the decoder's linear layers in float8 "
                            "e4m3 with dynamic scales (torchao, `train.fp8`); the output head, embeddings, norms "
                            "and layers whose dims are not multiples of 16 stay bf16. Full fine-tuning with "
                            "bf16 on GPUs with float8 tensor cores (compute capability 8.9+: L4, L40S, RTX 4090, "
                            "H100, H200, B200), on single, ddp or fsdp.")
    optimizer_in_backward: bool = Field(
        False, description="Run the optimizer step for each parameter inside the backward pass, as soon as its "
                           "gradient is complete (one optimizer per parameter on a post-accumulate-grad hook, as "
                           "torchtune's `optimizer_in_bwd`), then free that gradient: the gradients of the whole "
                           "model never exist at once, and paged optimizer states are paged in one parameter at a "
                           "time. The learning-rate schedule still applies. One process only (single GPU or the "
                           "CPU), one micro batch per step (no gradient accumulation: `micro_batch_size` equal to "
                           "`global_batch_size`), no gradient clipping (`max_grad_norm: null`: the global norm "
                           "needs every gradient at once) and no fp16 (its loss scaling unscales every gradient "
                           "before the step).")
    tf32: Union[Literal["auto"], bool] = Field(
        "auto", description="TF32 tensor cores for fp32 matrix multiplies; `auto`: on for GPUs of compute "
                            "capability 8.0 (Ampere) or newer, off elsewhere.")
    seed: int = Field(42, ge=0, description="Seed for weights init, data order and dropout.")
    logging_steps: int = Field(10, gt=0, description="Log metrics every N optimizer steps.")
    eval_steps: Optional[int] = Field(None, gt=0, description="Evaluate every N steps (null: at the end of each epoch).")
    load_best_model_at_end: bool = Field(False, description="Keep the checkpoint with the best eval metric as final.")
    metric_for_best_model: str = Field("eval_loss", description="Metric that decides the best checkpoint.")
    divergence: DivergenceConfig = Field(
        default_factory=DivergenceConfig, description="Stop on NaN/inf losses, warn on sustained loss spikes.")
    unfrozen_parameters: Optional[list[UnfrozenPattern]] = Field(
        None, description="Full fine-tuning of only the parameters whose names match one of these patterns "
                          "(Axolotl's `unfrozen_parameters`, same semantics): a dot is a literal dot unless "
                          "followed by `+`; a pattern matches from the start of the name (`re.match`; end it "
                          "with `$` to match the whole name); a trailing `[start:end]` trains only those rows, "
                          "e.g. `^model.embed_tokens.weight$[32000:]`. Every other parameter is frozen; the "
                          "planner counts gradients and optimizer states for the selected ones only. A pattern "
                          "that selects nothing is an error. Needs `adapter.type: none` (null: train all).")
    fp8: Optional[FP8Config] = Field(
        None, description="FP8 training settings, with `train.precision: fp8` only (null: tensorwise scaling, "
                          "float8 all-gather on FSDP2).")
    qat: Optional[QATConfig] = Field(
        None, description="Quantization-aware training (torchao): train with the linear layers' weights "
                          "fake-quantized as the int4 export will store them, so `recipeforge export --format "
                          "torchao-int4` loses less; final/ holds plain full-precision weights. Full "
                          "fine-tuning only; needs the `torchao` extra (null: off).")

    @field_validator("checkpoint_every")
    @classmethod
    def _every_needs_full_checkpointing(cls, value, info: ValidationInfo):
        if value > 1 and info.data.get("gradient_checkpointing") is not True:
            raise ValueError(f"checkpoint_every: {value} picks which layers full checkpointing covers, and "
                             f"train.gradient_checkpointing is {info.data.get('gradient_checkpointing')!r}; set "
                             f"train.gradient_checkpointing: true, or checkpoint_every: 1")
        return value

    @field_validator("unfrozen_parameters")
    @classmethod
    def _rows_need_no_decay(cls, value, info: ValidationInfo):
        # Frozen rows get zero gradients, which leaves Adam's update at zero, but decoupled weight
        # decay would still shrink them every step.
        if value and (info.data.get("weight_decay") or 0) > 0:
            ranged = [f"[{i}] {v!r}" for i, v in enumerate(value) if parse_pattern(v).rows is not None]
            if ranged:
                raise ValueError(f"row ranges ({', '.join(ranged)}) keep the other rows unchanged only without "
                                 f"weight decay, and train.weight_decay is {info.data['weight_decay']}; set "
                                 f"train.weight_decay: 0 or select whole parameters")
        return value

    def fp8_settings(self) -> FP8Config:
        """`fp8`, or its defaults when the recipe leaves it out."""
        return self.fp8 if self.fp8 is not None else FP8Config()

    def linear_swap_keys(self) -> tuple[str, ...]:
        """The keys of the methods set here that swap whole linear layers for their own modules (`train.qat`,
        `train.precision: fp8`): layouts that split or shard those layers cannot run them (`plan.whole_linears`)."""
        keys = []
        if self.qat is not None:
            keys.append("train.qat")
        if self.precision == "fp8":
            keys.append("train.precision")
        return tuple(keys)
