"""ORPO, SimPO (CPO trainer) and KTO end to end on the tiny model: the preference rewards separate."""

from __future__ import annotations

import statistics

import pytest

pytestmark = pytest.mark.slow


def _mean(xs):
    return statistics.fmean(xs)


@pytest.fixture(scope="module")
def orpo_run(tiny, tmp_path_factory):
    return tiny.train("orpo", tmp_path_factory.mktemp("orpo") / "run")


@pytest.fixture(scope="module")
def simpo_run(tiny, tmp_path_factory):
    return tiny.train("simpo", tmp_path_factory.mktemp("simpo") / "run")


@pytest.fixture(scope="module")
def kto_run(tiny, tmp_path_factory):
    return tiny.train("kto", tmp_path_factory.mktemp("kto") / "run")


def test_orpo_reward_accuracy_and_margin_rise(tiny, orpo_run):
    acc = tiny.values(orpo_run, "rewards/accuracies")
    margins = tiny.values(orpo_run, "rewards/margins")
    assert _mean(acc[:2]) <= 0.65 and acc[-1] >= 0.9, acc
    assert abs(margins[0]) < 0.05 and margins[-1] > 0.3, margins
    evals = tiny.records(orpo_run, "eval")
    assert evals and evals[-1]["eval_rewards/margins"] > 0
    # No reference model: a full fine-tune writes one model, and the card names the method.
    assert "model.safetensors" in tiny.files(orpo_run / "final")
    assert "trained with ORPO" in (orpo_run / "README.md").read_text()


def test_simpo_reward_accuracy_and_margin_rise(tiny, simpo_run):
    acc = tiny.values(simpo_run, "rewards/accuracies")
    margins = tiny.values(simpo_run, "rewards/margins")
    assert _mean(acc[:2]) <= 0.6 and acc[-1] >= 0.9, acc
    assert abs(margins[0]) < 0.05 and margins[-1] > 0.3, margins
    assert {"adapter_config.json", "adapter_model.safetensors"} <= tiny.files(simpo_run / "final")
    assert "trained with SimPO" in (simpo_run / "README.md").read_text()


def test_kto_rewards_separate_around_the_kl_reference_point(tiny, kto_run):
    beta = 0.5  # kto.beta of the example
    rows = [r for r in tiny.records(kto_run, "train") if "rewards/margins" in r]
    first, last = rows[0], rows[-1]
    # The policy starts as the reference (adapters disabled): every reward and the KL are 0.
    assert first["rewards/margins"] == first["kl"] == 0.0
    assert last["rewards/margins"] > 1.0, [r["rewards/margins"] for r in rows]
    # KTO's value compares each reward with beta x KL: desirable completions end above it, undesirable below.
    assert last["rewards/chosen"] - beta * last["kl"] > 0.2
    assert last["rewards/rejected"] - beta * last["kl"] < -0.2
    assert "trained with KTO" in (kto_run / "README.md").read_text()


def test_kto_full_fine_tune_uses_a_reference_copy(tiny, tmp_path):
    run = tiny.train("kto", tmp_path / "run", "adapter.type=none", "train.learning_rate=2e-3", "train.max_steps=15")
    margins = tiny.values(run, "rewards/margins")
    assert margins[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    assert margins[-1] > 0.3, margins
    assert "model.safetensors" in tiny.files(run / "final")
