"""Partial full fine-tuning (`train.unfrozen_parameters`) and torchao's low-bit AdamW, end to end on
the tiny model."""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.errors import RecipeError

pytestmark = pytest.mark.slow

SHORT = ("train.max_steps=20", "data.val_size=0", "train.eval_steps=null", "output.save_steps=20")


def _initial_and_final(run_dir):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from recipeforge.components.models import build_tiny_model

    tok = AutoTokenizer.from_pretrained(run_dir / "final")
    fresh = build_tiny_model("llama", tok, seed=42, dtype=torch.float32, attn_implementation="sdpa")
    return dict(fresh.named_parameters()), load_file(str(run_dir / "final" / "model.safetensors"))


def test_unfrozen_parameters_train_only_the_selected_ones(tiny, tmp_path):
    patterns = '["model.layers.1.mlp", "^lm_head.weight$", "^model.embed_tokens.weight$[:100]"]'
    run = tiny.train("sft-full", tmp_path / "run", *SHORT, f"train.unfrozen_parameters={patterns}")
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 1.0, loss
    before, after = _initial_and_final(run)
    changed = {n for n, p in before.items() if not p.detach().equal(after[n])}
    assert changed == {"model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
                       "model.layers.1.mlp.down_proj.weight", "lm_head.weight", "model.embed_tokens.weight"}
    emb_before, emb_after = before["model.embed_tokens.weight"].detach(), after["model.embed_tokens.weight"]
    assert not emb_before[:100].equal(emb_after[:100])  # the selected rows trained
    assert emb_before[100:].equal(emb_after[100:])      # the other rows kept their values


def test_unfrozen_pattern_that_selects_nothing_names_real_parameters(tiny, tmp_path):
    loaded = tiny.load("sft-full", tmp_path / "run", *SHORT,
                       'train.unfrozen_parameters=["model.layers.0.mlp", "transformer.h.0"]')
    from recipeforge.run import train

    with pytest.raises(RecipeError) as err:
        train(loaded, overwrite=True)
    text = str(err.value)
    assert "train.unfrozen_parameters[1]" in text and "'transformer.h.0' selects no parameter" in text
    assert "model.embed_tokens.weight" in text  # real names to choose from


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_torchao_low_bit_adamw_trains_on_the_cpu(tiny, tmp_path):
    """8-bit through the whole run (torchao compiles its step once per parameter shape, which is most
    of this test's time); the 4-bit states are checked on a real optimizer step in
    tests/unit/plan/test_plan_low_bit_optimizers.py."""
    import torch

    optimizer, state_class = "adamw_torchao_8bit", "OptimState8bit"

    run = tiny.train("sft-full", tmp_path / "run", *SHORT, f"train.optimizer={optimizer}")
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 1.0, loss
    # the checkpoint's optimizer states are torchao's block-quantized tensors
    state = torch.load(run / "checkpoints" / "checkpoint-20" / "optimizer.pt", weights_only=False)["state"]
    kinds = {type(s["exp_avg"]).__name__ for s in state.values()}
    assert state_class in kinds, kinds
