"""final/ holds full weights in the run's 16-bit compute dtype when training kept fp32 master weights
(mixed precision, FSDP2's fp32 shards): written and loaded back with transformers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny(tied: bool):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).float()


@pytest.mark.parametrize("tied", [True, False])
def test_fp32_masters_are_written_in_bf16_and_load_as_bf16(tmp_path, tied):
    from recipeforge.outputs.weights import save_pretrained_atomic

    model = _tiny(tied)
    save_pretrained_atomic(model, None, tmp_path / "final", dtype=torch.bfloat16)
    config = json.loads((tmp_path / "final" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert loaded.dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16)), name
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    assert model.dtype == torch.float32  # the trained model itself is left as it was


def test_modules_kept_in_fp32_stay_fp32(tmp_path):
    from recipeforge.outputs.weights import weights_in

    model = _tiny(False)
    model._keep_in_fp32_modules = ["norm"]
    state, dtype = weights_in(model, None, torch.bfloat16)
    assert dtype == torch.bfloat16
    assert state["model.norm.weight"].dtype == torch.float32
    assert state["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16


def test_weights_already_16_bit_are_written_as_they_are(tmp_path):
    from recipeforge.outputs.weights import save_pretrained_atomic

    model = _tiny(False).to(torch.bfloat16)
    save_pretrained_atomic(model, None, tmp_path / "final", dtype=torch.bfloat16)
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final").dtype == torch.bfloat16


@pytest.mark.parametrize(("dtype", "device", "expected"), [
    ("bf16", "cpu", torch.bfloat16), ("fp16", "cuda", torch.float16), ("fp32", "cuda", None), ("auto", "cpu", None)])
def test_the_final_dtype_is_the_runs_compute_dtype(dtype, device, expected):
    from recipeforge.stages.precision import final_weights_dtype

    recipe = SimpleNamespace(model=SimpleNamespace(dtype=dtype))
    assert final_weights_dtype(recipe, SimpleNamespace(device=device)) == expected
