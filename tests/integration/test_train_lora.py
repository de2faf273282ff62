"""LoRA SFT on chat messages, the adapter files, and merging the adapter into the base."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lora_run(tiny, tmp_path_factory):
    return tiny.train("sft-lora", tmp_path_factory.mktemp("lora") / "run")


def test_lora_sft_loss_falls(tiny, lora_run):
    loss = tiny.values(lora_run, "loss")
    assert loss[-1] < loss[0] - 3.0, loss


def test_lora_run_dir_files(tiny, lora_run):
    top = {p.name for p in lora_run.iterdir()} - {"logs"}  # logs/: library warnings, when there were any
    assert top == {"README.md", "resolved_recipe.yaml", "recipe.lock.yaml", "plan.json", "environment.json",
                   "metrics.jsonl", "loss.png", "checkpoints", "final", "merged", "base_model",
                   "phase_memory", ".recipeforge-owned"}  # the marker that lets --overwrite replace this folder
    final = tiny.files(lora_run / "final")
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= final
    assert "model.safetensors" not in final  # only the adapter
    assert "model.safetensors" in tiny.files(lora_run / "merged")
    assert "model.safetensors" in tiny.files(lora_run / "base_model")
    cfg = json.loads((lora_run / "final" / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and cfg["modules_to_save"] == ["lm_head"]
    assert "library_name: peft" in (lora_run / "README.md").read_text()


def test_merged_model_matches_base_plus_adapter(lora_run, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipeforge.run import merge

    out = merge(lora_run, tmp_path / "merged-again")
    assert out == tmp_path / "merged-again"
    tok = AutoTokenizer.from_pretrained(lora_run / "final")
    text = tok.apply_chat_template([{"role": "user", "content": "What does the dog say?"},
                                    {"role": "assistant", "content": "The dog says woof."}], tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(lora_run / "base_model")
    with torch.no_grad():
        base_logits = base(ids).logits
        with_adapter = PeftModel.from_pretrained(base, lora_run / "final").eval()(ids).logits
        for merged_dir in (out, lora_run / "merged"):
            merged = AutoModelForCausalLM.from_pretrained(merged_dir)  # plain transformers, no peft
            torch.testing.assert_close(merged(ids).logits, with_adapter, atol=1e-4, rtol=1e-4)
    assert (with_adapter - base_logits).abs().max() > 0.1  # the adapter changed something


def test_merge_refuses_a_full_model(tiny, tmp_path):
    from recipeforge.errors import RecipeError
    from recipeforge.run import merge

    run = tiny.train("sft-full", tmp_path / "full", "train.max_steps=2")
    with pytest.raises(RecipeError, match="nothing to merge"):
        merge(run)
