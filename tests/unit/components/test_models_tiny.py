"""Model loading: the tiny factory, dtype/attention choices, QLoRA checks."""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.components.models import build_tiny_model, load_model, resolve_attn_implementation, resolve_dtype
from recipeforge.components.tiny_spec import TINY_CONFIGS
from recipeforge.components.tokenizer import build_tiny_tokenizer
from recipeforge.errors import RecipeError


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


# The tiny language models; the tiny vision-language ones (a text_config inside) are tested in
# tests/integration/test_vlm.py.
@pytest.mark.parametrize("arch", sorted(a for a, c in TINY_CONFIGS.items() if "text_config" not in c))
def test_tiny_models_follow_the_spec_and_the_seed(tok, arch):
    import torch

    a = build_tiny_model(arch, tok, seed=1, dtype=torch.float32, attn_implementation="sdpa")
    b = build_tiny_model(arch, tok, seed=1, dtype=torch.float32, attn_implementation="sdpa")
    c = build_tiny_model(arch, tok, seed=2, dtype=torch.float32, attn_implementation="sdpa")
    spec = TINY_CONFIGS[arch]
    assert a.config.model_type == spec["model_type"] and a.config.hidden_size == spec["hidden_size"]
    assert a.config.vocab_size == len(tok) == spec["vocab_size"]
    assert a.config.eos_token_id == tok.eos_token_id and a.generation_config.pad_token_id == tok.pad_token_id
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))


def test_building_a_model_leaves_the_global_rng_alone(tok):
    import torch

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_tiny_model("llama", tok, seed=5, dtype=torch.float32, attn_implementation="sdpa")
    assert torch.equal(torch.rand(3), expected)


def test_dtype_and_attention_on_cpu():
    import torch

    assert resolve_dtype("auto", "cpu") == torch.float32 and resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_attn_implementation("auto", "cpu") == "sdpa"
    assert resolve_attn_implementation("eager", "cpu") == "eager"
    with pytest.raises(RecipeError, match="needs a CUDA GPU"):
        resolve_attn_implementation("flash_attention_2", "cpu")
    with pytest.raises(RecipeError, match="no backward pass on CPU"):
        resolve_attn_implementation("flex_attention", "cpu")


def test_unknown_models(tok, tmp_path):
    with pytest.raises(RecipeError, match="unknown tiny model 'tiny:gpt'") as info:
        load_model("tiny:gpt", tok, device="cpu")
    assert "tiny:llama" in info.value.problems[0].hint
    with pytest.raises(RecipeError, match="cannot load") as info:
        load_model(str(tmp_path / "missing"), tok, device="cpu")
    assert info.value.problems[0].key == "model.name_or_path"


def test_local_directory_round_trip(tok, tmp_path):
    import torch

    model = build_tiny_model("qwen2", tok, seed=3, dtype=torch.float32, attn_implementation="sdpa")
    model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), tok, device="cpu")
    assert loaded.dtype == torch.float32 and loaded.config._attn_implementation == "sdpa"
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), loaded.parameters()))


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_qlora_needs_bitsandbytes():
    from recipeforge.components.adapters import quantization_config
    from recipeforge.config.schema import AdapterConfig

    with pytest.raises(RecipeError, match="bitsandbytes") as info:
        quantization_config(AdapterConfig(type="qlora"), None, "cpu")
    assert "recipeforge[qlora]" in info.value.problems[0].hint
