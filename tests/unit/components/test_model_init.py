"""Random init module by module (`components.model_init`): the weights are a function of the seed and
the architecture alone; the base written for a LoRA run (`outputs.weights.write_random_base`) holds
exactly the weights training made, and quantizes to the same 4-bit words; the skeleton takes no memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipeforge.components.model_init import build_skeleton, module_seed
from recipeforge.components.models import build_random, config_for, random_spec, tiny_config
from recipeforge.components.tokenizer import load_tokenizer
from recipeforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[3]
LLAMA = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny:llama")


def _spec(tok, fields=LLAMA, *, seed=7, dtype=torch.float32, new_rows=()):
    return random_spec(config_for(dict(fields), tok), tok, seed=seed, dtype=dtype, attn_implementation="sdpa",
                       new_rows=new_rows)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_module_seeds_are_stable_and_distinct():
    assert module_seed(42, "model.layers.0.mlp.up_proj") == module_seed(42, "model.layers.0.mlp.up_proj")
    assert len({module_seed(s, n) for s in (1, 2) for n in ("a", "b", "model.layers.0")}) == 6


def test_a_module_gets_the_same_weights_in_any_model_it_is_part_of(tok):
    """Seeded by its name: layer 0 of a 2-layer and of a 3-layer model are equal (no dependence on what
    else is made, or in which order); another seed gives other weights."""
    two = _weights(build_random(_spec(tok), tok, name="two"))
    three = _weights(build_random(_spec(tok, {**LLAMA, "num_hidden_layers": 3}), tok, name="three"))
    other = _weights(build_random(_spec(tok, seed=8), tok, name="other"))
    for key in two:
        assert torch.equal(two[key], three[key]), key
    assert not torch.equal(two["model.layers.0.mlp.up_proj.weight"], other["model.layers.0.mlp.up_proj.weight"])
    w = two["model.layers.1.self_attn.q_proj.weight"]
    assert 0.015 < w.std().item() < 0.025 and abs(w.mean().item()) < 0.005  # the model's own N(0, 0.02)
    assert torch.equal(two["model.norm.weight"], torch.ones(64))


def test_a_16_bit_model_holds_the_same_weights_rounded(tok):
    full = _weights(build_random(_spec(tok), tok, name="fp32"))
    half = _weights(build_random(_spec(tok, dtype=torch.bfloat16), tok, name="bf16"))
    for key in full:
        assert half[key].dtype == torch.bfloat16 and torch.equal(half[key], full[key].to(torch.bfloat16)), key


def test_tied_embeddings_and_added_token_rows(tok):
    """A tied output layer is the embedding itself; the rows of added tokens are the mean of the others."""
    tok2 = load_tokenizer("tiny:qwen2")
    tok2.add_tokens(["<tool>", "</tool>"])
    spec = random_spec(tiny_config("qwen2", tok2), tok2, seed=3, dtype=torch.float32, attn_implementation="sdpa",
                       new_rows=(1024, 1025))
    model = build_random(spec, tok2, name="tiny:qwen2")
    emb = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is emb and emb.shape[0] == len(tok2) == 1026
    torch.testing.assert_close(emb[1024:], emb[:1024].mean(dim=0).expand(2, -1))


@pytest.mark.parametrize("shard_bytes", [2**30, 200_000])
def test_the_written_base_is_the_model_training_made(tok, tmp_path, shard_bytes):
    """Written one module at a time (in several files when they would be large), it loads in plain
    transformers to exactly the weights `build_random` made, tied and added rows included."""
    from transformers import AutoModelForCausalLM

    from recipeforge.outputs.weights import write_random_base

    tok2 = load_tokenizer("tiny:qwen2")
    tok2.add_tokens(["<x>"])
    spec = random_spec(tiny_config("qwen2", tok2), tok2, seed=5, dtype=torch.float32, attn_implementation="sdpa",
                       new_rows=(1024,))
    made = build_random(spec, tok2, name="tiny:qwen2")
    out = write_random_base(spec, tok2, tmp_path / "base_model", device="cpu", generation_config=made.generation_config,
                            shard_bytes=shard_bytes)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert (len(files) > 1) == (shard_bytes < 2**30) and (out / "tokenizer.json").is_file()
    if len(files) > 1:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"].values()) == set(files)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    mine, theirs = _weights(made), _weights(loaded)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key
    assert loaded.config.pad_token_id == tok2.pad_token_id


def test_a_written_4bit_base_quantizes_to_the_words_training_used(tok, tmp_path):
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from recipeforge.outputs.weights import write_random_base

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    spec = _spec(tok, dtype=torch.bfloat16)
    made = build_random(spec, tok, name="q", quantization_config=quant)
    out = write_random_base(spec, tok, tmp_path / "base", device="cpu")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, quantization_config=quant,
                                                  device_map={"": "cpu"})
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        a, b = made.get_submodule(name).weight, loaded.get_submodule(name).weight
        # packed 4-bit words stored in bf16 (some are NaN as numbers): compared as bits
        assert type(a).__name__ == "Params4bit" and torch.equal(a.data.view(torch.int16), b.data.view(torch.int16)), name
        assert torch.equal(a.quant_state.absmax, b.quant_state.absmax)


def test_the_skeleton_of_an_8b_model_takes_no_memory():
    """Llama-3.1-8B's architecture on the meta device: every parameter without storage, in well under
    a second's work and a few MiB of this process."""
    from recipeforge.backends.process_memory import released_rss_bytes

    fields = json.loads((REPO / "bench" / "gpu" / "models" / "llama-3.1-8b" / "config.json").read_text())
    config = config_for(fields, load_tokenizer("tiny:llama"))
    before = released_rss_bytes()
    model, _ = build_skeleton(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    grown = released_rss_bytes() - before
    params = list(model.parameters())
    assert sum(p.numel() for p in params) > 8e9 and all(p.device.type == "meta" for p in params)
    assert grown < 64 * 2**20, grown


def test_an_init_that_leaves_a_parameter_untouched_is_refused(tok, monkeypatch):
    """A model whose `_init_weights` skips a module would train from uninitialized memory: refused,
    naming the parameter."""
    from transformers import LlamaForCausalLM

    original = LlamaForCausalLM._init_weights

    def skips_the_gate(self, module):
        if getattr(module, "_recipeforge_prefix", "") != "model.layers.1.mlp.gate_proj":
            original(self, module)

    monkeypatch.setattr(LlamaForCausalLM, "_init_weights", skips_the_gate)
    monkeypatch.setattr("transformers.LlamaModel._init_weights", skips_the_gate)
    with pytest.raises(RecipeError) as err:
        build_random(_spec(tok), tok, name="x")
    assert "model.layers.1.mlp.gate_proj.weight" in str(err.value) and err.value.problems[0].key == "model.init"
