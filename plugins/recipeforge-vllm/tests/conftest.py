"""Skip `gpu` tests without CUDA (the plugin's tests also run on CPU-only CI); the tiny model vLLM's CPU
build can run."""

from pathlib import Path

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if not _cuda():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Llama vLLM's CPU attention takes (head size 32; the built-in tiny models use 16)."""
    import torch

    from recipeforge.components.models import build_random_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("vllm-model")
    tok = build_tiny_tokenizer(1024)
    config = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 512, "tie_word_embeddings": False}
    model = build_random_model(config, tok, name="tiny-vllm", seed=0, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
