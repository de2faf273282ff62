"""`model:` — which base model to train and how to load it."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from recipeforge.config.schema.base import Section

Dtype = Literal["auto", "bf16", "fp16", "fp32"]
AttnImplementation = Literal["auto", "eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"]


class ModelConfig(Section):
    """The base model: a local directory, a hub id, or a built-in ``tiny:<arch>`` model for offline runs."""

    name_or_path: str = Field(
        description="Local directory with config.json, a hub id (e.g. meta-llama/Llama-3.1-8B), or "
                    "`tiny:llama` / `tiny:qwen2` for a small random-init model built locally (offline).",
        min_length=1)
    revision: Optional[str] = Field(None, description="Hub revision (branch, tag or commit) to load.")
    tokenizer: Optional[str] = Field(
        None, description="Tokenizer path or hub id when it differs from `name_or_path`.")
    dtype: Dtype = Field(
        "auto", description="Weight/compute dtype. `auto`: bf16 on GPUs that support it, else fp16 on "
                            "GPU, fp32 on CPU.")
    attn_implementation: AttnImplementation = Field(
        "auto", description="Attention kernel. `auto`: flash_attention_2 when installed on a GPU, else sdpa.")
    trust_remote_code: bool = Field(
        False, description="Allow the model's own Python code from the hub to run. Off unless you trust it.")
    max_position_embeddings: Optional[int] = Field(
        None, gt=0, description="Override the context length the model is built with (RoPE scaling aside).")
