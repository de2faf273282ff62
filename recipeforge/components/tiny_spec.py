"""Architectures of the built-in ``tiny:<arch>`` models (pure data, no torch).

``model.name_or_path: tiny:llama`` builds a small random-init model from these settings with a
tokenizer made locally, so every example and test runs offline on a CPU. The planner reads the
same numbers to size them.
"""

from __future__ import annotations

TINY_PREFIX = "tiny:"

# The tiny Llama, also the language model of the tiny vision-language model.
_LLAMA = {
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}

# transformers config class name -> kwargs. Vocabulary matches the locally built tokenizer.
TINY_CONFIGS: dict[str, dict] = {
    "llama": _LLAMA,
    "qwen2": {**_LLAMA, "model_type": "qwen2", "tie_word_embeddings": True},
    # A mixture of experts in Qwen3-MoE's layout (transformers' fused 3-D expert weights, a top-k router
    # per layer): 8 experts of width 32, 2 per token, in both layers. The load-balancing coefficient is
    # raised from Qwen3's 0.001 so the auxiliary loss visibly shapes a run of a few dozen steps.
    "qwen3_moe": {**_LLAMA, "model_type": "qwen3_moe", "head_dim": 16, "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                  "router_aux_loss_coef": 0.01},
    # A vision-language model (LLaVA layout): a 2-layer CLIP vision tower on 28x28 images (16 patches of
    # 7x7, each one image token), a 2-layer MLP projector and the tiny Llama. The vocabulary is the tiny
    # tokenizer's 1024 tokens plus the image token; `image_token_id` is set from the tokenizer.
    "llava": {
        "model_type": "llava",
        "text_config": {**_LLAMA, "vocab_size": 1025},
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 7,
            "projection_dim": 32,
        },
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -1,
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
    },
}

# The image side of the tiny vision-language models: the token that stands for an image in the text
# (added to the tiny tokenizer) and the image size the processor resizes and crops to.
TINY_VISION: dict[str, dict] = {
    "llava": {"image_token": "<image>", "image_size": 28, "patch_size": 7},
}


def tiny_arch(name_or_path: str) -> str | None:
    """The tiny architecture a model name refers to, or None for real models."""
    if not name_or_path.startswith(TINY_PREFIX):
        return None
    return name_or_path[len(TINY_PREFIX):]


# The tiny VLMs' chat template: ChatML, an image entry written as the image token, and each assistant
# reply with its turn end inside {% generation %} (the tokens that carry the loss).
TINY_VISION_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}{%- generation -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for c in message['content'] -%}{%- if c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}{{- '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for c in message['content'] -%}"
    "{%- if c['type'] == 'image' -%}{{- '<image>' -}}{%- elif c['type'] == 'text' -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
