"""Architectures of the built-in ``tiny:<arch>`` models (pure data, no torch).

``model.name_or_path: tiny:llama`` builds a small random-init model from these settings with a
tokenizer made locally, so every example and test runs offline on a CPU. The planner reads the
same numbers to size them.
"""

from __future__ import annotations

TINY_PREFIX = "tiny:"

# transformers config class name -> kwargs. Vocabulary matches the locally built tokenizer.
TINY_CONFIGS: dict[str, dict] = {
    "llama": {
        "model_type": "llama",
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "vocab_size": 1024,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
}


def tiny_arch(name_or_path: str) -> str | None:
    """The tiny architecture a model name refers to, or None for real models."""
    if not name_or_path.startswith(TINY_PREFIX):
        return None
    return name_or_path[len(TINY_PREFIX):]
