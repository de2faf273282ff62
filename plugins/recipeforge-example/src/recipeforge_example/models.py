"""The model ``example/tiny-wide``: an architecture the planner sizes, and how to build it.

A `recipeforge.components.models.ModelEntry` holds `config` (config.json fields: the planner counts
parameters and memory from them without any weights) and, optionally, `load`, which builds the model
for training. Without a loader the id is loaded from the hub like any other. This one is a small
random-init Llama, built offline, so it can train on a CPU in seconds; pair it with the tokenizer
``tiny:llama`` (``model.tokenizer: tiny:llama``; the vocabularies match).
"""

from __future__ import annotations

from recipeforge.components.models import ModelEntry
from recipeforge.errors import RecipeError

CONFIG = {
    "model_type": "llama",
    "vocab_size": 1024,          # the vocabulary of recipeforge's tiny tokenizer
    "hidden_size": 96,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def load_tiny_wide(name: str, tokenizer, *, dtype, attn_implementation: str, seed: int,
                   max_position_embeddings: int | None = None, quantization_config=None, **_options):
    """Build the model (random init, the same weights for the same seed, which resuming relies on)."""
    if quantization_config is not None:
        raise RecipeError(f"model '{name}' is built in memory and cannot be quantized", key="adapter.type",
                          hint="use adapter.type: lora or none")
    from recipeforge.components.models import build_random_model  # imports torch: only when training

    return build_random_model(CONFIG, tokenizer, name=name, seed=seed, dtype=dtype,
                              attn_implementation=attn_implementation,
                              max_position_embeddings=max_position_embeddings)


TINY_WIDE = ModelEntry(CONFIG, load=load_tiny_wide, description="a small random-init Llama, built offline")
