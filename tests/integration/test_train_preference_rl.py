"""DPO and GRPO end to end on the tiny model: reward accuracy/margins and mean reward rise."""

from __future__ import annotations

import json
import statistics

import pytest

pytestmark = pytest.mark.slow


def _mean(xs):
    return statistics.fmean(xs)


@pytest.fixture(scope="module")
def dpo_run(tiny, tmp_path_factory):
    return tiny.train("dpo", tmp_path_factory.mktemp("dpo") / "run")


@pytest.fixture(scope="module")
def grpo_run(tiny, tmp_path_factory):
    return tiny.train("grpo", tmp_path_factory.mktemp("grpo") / "run")


def test_dpo_reward_accuracy_and_margin_rise(tiny, dpo_run):
    acc = tiny.values(dpo_run, "rewards/accuracies")
    margins = tiny.values(dpo_run, "rewards/margins")
    assert _mean(acc[:2]) <= 0.6 and acc[-1] >= 0.9, acc
    assert margins[0] == pytest.approx(0.0, abs=1e-3) and margins[-1] > 0.1, margins
    evals = tiny.records(dpo_run, "eval")
    assert evals and all("eval_rewards/accuracies" in r and "eval_rewards/margins" in r for r in evals)
    assert evals[-1]["eval_rewards/margins"] > 0


def test_dpo_with_lora_saves_an_adapter(tiny, dpo_run):
    assert {"adapter_config.json", "adapter_model.safetensors"} <= tiny.files(dpo_run / "final")
    assert (dpo_run / "base_model" / "model.safetensors").is_file()


def test_dpo_full_fine_tune_uses_a_reference_copy(tiny, tmp_path):
    run = tiny.train("dpo", tmp_path / "run", "adapter.type=none", "train.learning_rate=5e-3", "train.max_steps=20",
                     "data.val_size=0")
    margins = tiny.values(run, "rewards/margins")
    assert margins[0] == pytest.approx(0.0, abs=1e-3)  # policy == reference at the start
    assert margins[-1] > 0.05, margins
    assert "model.safetensors" in tiny.files(run / "final")


def test_grpo_mean_reward_rises(tiny, grpo_run):
    reward = tiny.values(grpo_run, "reward")
    assert len(reward) >= 6
    assert _mean(reward[-2:]) > _mean(reward[:2]) + 0.5, reward
    per_function = tiny.records(grpo_run, "train")[-1]
    assert "rewards/length/mean" in per_function and "rewards/exact_match/mean" in per_function
    assert "model.safetensors" in tiny.files(grpo_run / "final")


def test_grpo_extra_columns_reach_the_rewards(tiny, tmp_path):
    """An exact_match reward against a column a completion always contains gets the full reward."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {w}:", "target": "", "ignored": w}) + "\n"
                            for w in ("moo", "woof", "meow", "baa")))
    run = tiny.train("grpo", tmp_path / "run", f"data.datasets=[{{path: {data}, format: prompt}}]",
                     "train.max_steps=2", "grpo.rewards=[{name: exact_match, args: {column: target, mode: contains}}]")
    got = tiny.values(run, "rewards/exact_match/mean")
    assert got and all(v == 1.0 for v in got)


def test_grpo_kl_term_builds_its_reference_from_the_saved_base(tiny, tmp_path):
    run = tiny.train("grpo", tmp_path / "run", "grpo.beta=0.04", "train.max_steps=3", "train.logging_steps=1")
    kl = tiny.values(run, "kl")
    assert len(kl) == 3 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 0  # starts at the reference
    assert (run / "base_model" / "model.safetensors").is_file()


def test_grpo_with_a_reward_model_directory(tiny, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    from recipeforge.components.models import tiny_config
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(1024)
    config = tiny_config("llama", tok)
    config.num_labels = 1
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    run = tiny.train("grpo", tmp_path / "run", "train.max_steps=2", "train.logging_steps=1",
                     f"grpo.rewards=[{{name: reward_model, args: {{path: {tmp_path / 'rm'}}}}}, "
                     "{name: length, weight: 0.5, args: {target: 5}}]")
    last = tiny.records(run, "train")[-1]
    assert "rewards/reward_model/mean" in last and "rewards/length/mean" in last
    assert last["rewards/reward_model/std"] > 0  # the model scored completions differently
