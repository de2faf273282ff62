"""`model:` — which base model to train and how to load it."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from recipeforge.config.schema.base import Section
from recipeforge.config.schema.tokens import SpecialTokens, check_tokens

Dtype = Literal["auto", "bf16", "fp16", "fp32"]
AttnImplementation = Literal["auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"]


class VisionConfig(Section):
    """A vision-language model's image side: which parts train, and how images are sized. Read only for
    models with a vision tower (transformers' `AutoModelForImageTextToText` models)."""

    train_tower: bool = Field(
        False, description="Train the vision encoder (ViT) too. Off: its weights stay as loaded (frozen); LoRA "
                            "never targets it.")
    train_projector: bool = Field(
        False, description="Train the projector (merger) that maps image features into the language model. Full "
                           "fine-tuning trains its weights; with LoRA its linears get adapters.")
    min_pixels: Optional[int] = Field(
        None, gt=0, description="Smallest image area in pixels the processor resizes to (Qwen-VL style processors; "
                                "others: shortest edge squared). Default: the processor's own.")
    max_pixels: Optional[int] = Field(
        None, gt=0, description="Largest image area in pixels the processor resizes to: bounds the image tokens of "
                                "one image, and the planner sizes images at it. Default: the processor's own.")
    images_per_sample: int = Field(
        1, ge=0, description="Images in a training sample, for the planner's activation estimate (the data may "
                             "hold fewer).")


class ModelConfig(Section):
    """The base model: a local directory, a hub id, or a built-in ``tiny:<arch>`` model for offline runs."""

    name_or_path: str = Field(
        description="Local directory with config.json, a hub id (e.g. meta-llama/Llama-3.1-8B), or "
                    "`tiny:llama` / `tiny:qwen2` for a small random-init model built locally (offline; "
                    "`tiny:llava` is a vision-language one).",
        min_length=1)
    revision: Optional[str] = Field(None, description="Hub revision (branch, tag or commit) to load.")
    tokenizer: Optional[str] = Field(
        None, description="Tokenizer path or hub id when it differs from `name_or_path`.")
    dtype: Dtype = Field(
        "auto", description="Weight/compute dtype. `auto`: bf16 on GPUs that support it, else fp16 on "
                            "GPU, fp32 on CPU.")
    attn_implementation: AttnImplementation = Field(
        "auto", description="Attention kernel. `auto`: flash_attention_2 when installed on a GPU, else sdpa.")
    init: Literal["pretrained", "random"] = Field(
        "pretrained",
        description="`pretrained`: load the weights at `name_or_path`. `random`: build the architecture from its "
                    "config.json (a local directory, a known hub id, or the hub) with random weights, seeded by "
                    "`train.seed`: pretraining from scratch, or benchmarking a model's shape without its weights. "
                    "The weights are made on the training device one module at a time (each process only its "
                    "shards under FSDP2 and ZeRO-3), the same for a seed whatever the number of processes; with "
                    "an adapter, the base is written to base_model/ at the first save.")
    trust_remote_code: bool = Field(
        False, description="Allow the model's own Python code from the hub to run. Off unless you trust it; "
                           "running it also needs the code opt-in (`allow_code: true` or --trust-code).")
    max_position_embeddings: Optional[int] = Field(
        None, gt=0, description="Override the context length the model is built with (RoPE scaling aside).")
    # Vocabulary changes live here, not under data:, because they change the model: new embedding
    # rows, trained and saved with it, the same for every dataset (see docs/recipes.md).
    special_tokens: SpecialTokens = Field(
        default_factory=SpecialTokens,
        description="Set the tokenizer's bos/eos/pad/unk tokens, e.g. {pad_token: '<|pad|>'}; a token not in the "
                    "vocabulary is added (new embedding row, trained).")
    tokens: tuple[str, ...] = Field(
        (), description="Tokens to add to the vocabulary as written (e.g. ['<tool>', '</tool>']); each gets a new "
                        "embedding row, started at the mean of the others and trained (under LoRA too).")
    eot_tokens: tuple[str, ...] = Field(
        (), description="Tokens that end a turn when that is not the EOS token (e.g. ['<|eot_id|>']): added when "
                        "missing, generation stops at them, and with chat templates without generation blocks a "
                        "reply's trained part ends at the last one.")

    vision: VisionConfig = Field(
        default_factory=VisionConfig,
        description="Vision-language models: which of the vision tower and projector train, and image sizes.")

    _tokens_ok = field_validator("tokens", "eot_tokens")(classmethod(lambda cls, v: check_tokens(v)))
