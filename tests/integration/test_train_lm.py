"""Pretraining and SFT end to end on the tiny model: learning, the run directory, label masking."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

RUN_FILES = {"README.md", "resolved_recipe.yaml", "recipe.lock.yaml", "plan.json", "environment.json",
             "metrics.jsonl", "loss.png", ".recipeforge-owned"}  # the marker: --overwrite may replace it
OPTIONAL = {"logs"}  # library warnings, when there were any (outputs.console)
FINAL_FULL = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja"}
CHECKPOINT_CORE = {"trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                   "checkpoint_complete.json"}


@pytest.fixture(scope="module")
def pretrain_run(tiny, tmp_path_factory):
    return tiny.train("pretrain", tmp_path_factory.mktemp("pretrain") / "run")


@pytest.fixture(scope="module")
def sft_run(tiny, tmp_path_factory):
    return tiny.train("sft-full", tmp_path_factory.mktemp("sft") / "run")


def test_pretrain_loss_falls(tiny, pretrain_run):
    loss = tiny.values(pretrain_run, "loss")
    assert loss[0] > 6.5  # random init: about ln(1024)
    assert loss[-1] < loss[0] - 3.0, loss
    evals = tiny.values(pretrain_run, "eval_loss", "eval")
    assert len(evals) >= 2 and evals[-1] < evals[0]


def test_pretrain_run_dir_has_exactly_the_expected_files(tiny, pretrain_run):
    top = {p.name for p in pretrain_run.iterdir()} - OPTIONAL
    assert top == RUN_FILES | {"checkpoints", "final", "phase_memory"}
    assert {p.name for p in pretrain_run.iterdir() if p.is_file()} == RUN_FILES
    assert tiny.files(pretrain_run / "final") == FINAL_FULL
    # save_steps 40 of 80 steps, save_total_limit 2
    assert sorted(p.name for p in (pretrain_run / "checkpoints").iterdir()) == ["checkpoint-40", "checkpoint-80"]
    for ckpt in (pretrain_run / "checkpoints").iterdir():
        assert CHECKPOINT_CORE <= tiny.files(ckpt)


def test_run_dir_contents_describe_the_run(tiny, pretrain_run):
    import yaml

    plan = json.loads((pretrain_run / "plan.json").read_text())
    assert plan["backend"] == "single" and plan["device"] == "cpu" and plan["world_size"] == 1
    resolved = yaml.safe_load((pretrain_run / "resolved_recipe.yaml").read_text())
    assert resolved["stage"] == "pretrain" and resolved["model"]["name_or_path"] == "tiny:llama"
    env = json.loads((pretrain_run / "environment.json").read_text())
    assert {"torch", "transformers", "recipeforge"} <= set(env["packages"])
    card = (pretrain_run / "README.md").read_text()
    assert "```yaml" in card and "name_or_path: tiny:llama" in card and "## Results" in card
    data = tiny.records(pretrain_run, "data")
    assert data and data[0]["packing_efficiency"] > 0.9 and data[0]["train_rows"] > 0
    train = tiny.records(pretrain_run, "train")
    assert all("padding_share" in r for r in train)
    steps = [r["step"] for r in train]
    assert steps == sorted(steps) and steps[-1] == 80


def test_final_model_loads_with_plain_transformers(tiny, pretrain_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipeforge.components.models import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(pretrain_run / "final")
    tok = AutoTokenizer.from_pretrained(pretrain_run / "final")
    fresh = build_tiny_model("llama", tok, seed=42, dtype=torch.float32, attn_implementation="sdpa")
    ids = tok("The cow says moo.", return_tensors="pt")["input_ids"]

    def logprob_of_moo(m):
        with torch.no_grad():
            logp = m(ids).logits[0, :-1].log_softmax(-1)
        return logp[-2, ids[0, -2]].item()  # P(" moo" | "The cow says")

    # The pretraining text taught the animal sounds: far above the random-init model's ~1/1024.
    assert logprob_of_moo(model) > logprob_of_moo(fresh) + 2.0
    assert model.config.use_cache is True  # saved ready for generation
    out = model.generate(ids[:, :4], max_new_tokens=3, do_sample=False)
    assert out.shape[1] == 7


def test_sft_loss_falls(tiny, sft_run):
    loss = tiny.values(sft_run, "loss")
    assert loss[-1] < loss[0] - 3.0, loss
    evals = tiny.values(sft_run, "eval_loss", "eval")
    assert evals[-1] <= evals[0] and evals[-1] < 1.5, evals  # held-out rows: ~6.9 before training


def test_sft_answers_after_training(sft_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(sft_run / "final")
    tok = AutoTokenizer.from_pretrained(sft_run / "final")
    prompt = tok.apply_chat_template([{"role": "user", "content": "What does the cow say?"}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert answer.startswith("The "), answer  # learned the answer format (the animal may still be wrong)
