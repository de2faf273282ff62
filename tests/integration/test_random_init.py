"""`model.init: random`: train an architecture from its config.json with random weights (no checkpoint)."""

from __future__ import annotations

import json

import pytest

from recipeforge.errors import RecipeError

pytestmark = pytest.mark.slow

# A small Qwen2-shaped model that is not one of the built-in tiny ones: a different width, depth and
# vocabulary, so the run proves the config.json was read (the tiny tokenizer has 1024 tokens). The other
# fields are Qwen2.5's own config.json, special token ids included, as a user's file carries them.
CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 1536, "hidden_size": 48,
          "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
          "bos_token_id": 151643, "eos_token_id": 151643, "attention_dropout": 0.0, "hidden_act": "silu",
          "initializer_range": 0.02, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
          "use_sliding_window": False, "use_cache": True, "max_window_layers": 28, "transformers_version": "4.43.1"}


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2-shape")
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


def _overrides(config_dir) -> list[str]:
    return [f"model.name_or_path={config_dir}", "model.init=random", "model.tokenizer=tiny:llama",
            "train.max_steps=12", "train.eval_steps=12", "output.save_steps=12"]


def test_random_init_trains_the_configured_shape_and_learns(tiny, tmp_path, config_dir):
    from safetensors import safe_open

    run = tiny.train("sft-full", tmp_path / "run", *_overrides(config_dir))
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 0.5, loss
    saved = json.loads((run / "final" / "config.json").read_text())
    assert (saved["model_type"], saved["hidden_size"], saved["num_hidden_layers"], saved["vocab_size"]) == \
        ("qwen2", 48, 3, 1536)
    with safe_open(str(run / "final" / "model.safetensors"), "pt") as fh:
        assert tuple(fh.get_slice("model.embed_tokens.weight").get_shape()) == (1536, 48)
    # The planner sized the model from the same config.json.
    planned = json.loads((run / "plan.json").read_text())["extra"]["model"]
    assert planned["source"].endswith("config.json")


def test_the_same_seed_builds_the_same_weights(tiny, tmp_path, config_dir):
    import torch

    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    tok = load_tokenizer("tiny:llama")
    build = [load_model(str(config_dir), tok, device="cpu", dtype="fp32", seed=seed, random_config=dict(CONFIG))
             for seed in (7, 7, 8)]
    first = [p.detach() for p in (m.get_input_embeddings().weight for m in build)]
    assert torch.equal(first[0], first[1]) and not torch.equal(first[0], first[2])


def test_a_known_hub_id_is_built_offline_from_the_builtin_table(monkeypatch):
    from recipeforge.plan.catalog import architecture_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fields = architecture_config("meta-llama/Llama-3.2-1B")
    assert (fields["hidden_size"], fields["num_hidden_layers"], fields["vocab_size"]) == (2048, 16, 128256)


def test_no_config_is_a_located_error(monkeypatch, tmp_path):
    from recipeforge.plan.catalog import architecture_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RecipeError) as err:
        architecture_config("some-org/not-a-known-model")
    assert err.value.problems[0].key == "model.name_or_path" and "HF_HUB_OFFLINE" in str(err.value)


def test_a_tokenizer_larger_than_the_embedding_is_refused(config_dir):
    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    tok = load_tokenizer("tiny:llama")
    with pytest.raises(RecipeError) as err:
        load_model(str(config_dir), tok, device="cpu", dtype="fp32", random_config={**CONFIG, "vocab_size": 512})
    assert err.value.problems[0].key == "model.tokenizer" and "1024 tokens" in str(err.value)


def test_the_tokenizers_special_tokens_win_over_the_config_files(config_dir):
    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    tok = load_tokenizer("tiny:llama")
    model = load_model(str(config_dir), tok, device="cpu", dtype="fp32", seed=1, random_config=dict(CONFIG))
    assert (model.config.bos_token_id, model.config.eos_token_id) == (tok.bos_token_id, tok.eos_token_id)


def test_a_lora_run_writes_its_base_at_the_first_save_and_it_is_the_trained_base(tiny, tmp_path, config_dir):
    """No base_model/ before step 1: it is written right before the first checkpoint, its weights made
    again exactly as training made them (those `load_model` makes for the recipe's seed), and final/
    loads on it in peft."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import load_tokenizer

    run = tiny.train("sft-lora", tmp_path / "run", *_overrides(config_dir), "train.max_steps=6",
                     "train.eval_steps=6", "output.save_steps=4", "output.merge_adapter=false")
    first_step = next(r["time"] for r in tiny.records(run, "train") if r.get("step") == 1)
    written = (run / "base_model" / "model.safetensors").stat().st_mtime
    assert first_step < written < (run / "checkpoints" / "checkpoint-4").stat().st_mtime
    assert [r for r in tiny.records(run) if r.get("split") == "startup"][0]["model_load_s"] > 0
    made = load_model(str(config_dir), load_tokenizer("tiny:llama"), device="cpu", dtype="fp32", seed=42,
                      random_config=dict(CONFIG)).state_dict()
    saved = load_file(run / "base_model" / "model.safetensors")
    assert saved.keys() == made.keys() and all(torch.equal(saved[k], made[k]) for k in saved)
    base = AutoModelForCausalLM.from_pretrained(run / "base_model", dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        bare = base(ids).logits
        tuned = PeftModel.from_pretrained(base, run / "final")(ids).logits
    assert torch.isfinite(tuned).all() and not torch.allclose(bare, tuned)  # the adapter trained
