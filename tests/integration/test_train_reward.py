"""Reward models end to end on the tiny model: pair accuracy and score margin rise, final/ (and merged/
for LoRA) load as sequence-classification models, and a GRPO run scores its completions with one."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reward_run(tiny, tmp_path_factory):
    return tiny.train("reward", tmp_path_factory.mktemp("reward") / "run")


def _scores(model, tok, texts):
    import torch

    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits[:, 0]


def _pairs(tiny):
    rows = [json.loads(line) for line in (tiny.recipes.parents[1] / "data" / "preference.jsonl").open()]
    return [r["prompt"] + r["chosen"] for r in rows], [r["prompt"] + r["rejected"] for r in rows]


def test_pair_accuracy_and_margin_rise(tiny, reward_run):
    acc, margin = tiny.values(reward_run, "accuracy"), tiny.values(reward_run, "margin")
    assert len(acc) >= 8 and acc[0] <= 0.5 and acc[-1] >= 0.9, acc
    assert abs(margin[0]) < 0.05 and margin[-1] > 1.0, margin  # the random head scores both alike at first
    evals = tiny.records(reward_run, "eval")
    assert len(evals) >= 3 and evals[-1]["eval_accuracy"] >= 0.75 and evals[-1]["eval_margin"] > 0.5, evals
    assert evals[-1]["eval_margin"] > evals[0]["eval_margin"]


def test_final_loads_as_a_sequence_classifier_that_ranks_the_pairs(tiny, reward_run):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    final = reward_run / "final"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= tiny.files(final)
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tok = AutoTokenizer.from_pretrained(final)
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1
    chosen, rejected = _pairs(tiny)
    eos = tok.eos_token
    better = _scores(model, tok, [c + eos for c in chosen]) > _scores(model, tok, [r + eos for r in rejected])
    assert better.float().mean() >= 0.9, better
    card = (reward_run / "README.md").read_text()
    assert "Bradley-Terry reward model" in card and "AutoModelForSequenceClassification" in card
    assert "pipeline_tag: text-classification" in card and "| pair accuracy |" in card
    assert not torch.isnan(model.score.weight).any()


def test_lora_trains_the_score_head_and_merges_into_a_classifier(tiny, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run = tiny.train("reward", tmp_path / "run", "adapter.type=lora", "adapter.dropout=0.0",
                     "train.max_steps=6", "data.val_size=0", "train.eval_steps=null", "output.merge_adapter=true")
    adapter = json.loads((run / "final" / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]
    with safe_open(str(run / "final" / "adapter_model.safetensors"), "pt") as f:
        assert any("score" in k for k in f.keys())
    tok = AutoTokenizer.from_pretrained(run / "final")
    texts = _pairs(tiny)[0][:4]
    from_adapter = AutoModelForSequenceClassification.from_pretrained(run / "final").eval()
    merged = AutoModelForSequenceClassification.from_pretrained(run / "merged").eval()
    base = AutoModelForSequenceClassification.from_pretrained(run / "base_model").eval()
    assert type(merged).__name__ == "LlamaForSequenceClassification"
    got = _scores(merged, tok, texts)
    assert got.allclose(_scores(from_adapter, tok, texts), atol=1e-5)
    assert not got.allclose(_scores(base, tok, texts), atol=1e-3)  # the trained head and adapters count


def test_grpo_scores_completions_with_the_trained_reward_model(tiny, reward_run, tmp_path):
    run = tiny.train("grpo", tmp_path / "run", "train.max_steps=2", "train.logging_steps=1",
                     f"grpo.rewards=[{{name: reward_model, args: {{path: {reward_run / 'final'}}}}}]")
    records = tiny.records(run, "train")
    means = [r["rewards/reward_model/mean"] for r in records if "rewards/reward_model/mean" in r]
    stds = [r["rewards/reward_model/std"] for r in records if "rewards/reward_model/std" in r]
    assert len(means) == 2 and all(isinstance(v, float) for v in means + stds)
    assert all(s > 0 for s in stds) and means[0] != means[1]  # the model told completions apart
