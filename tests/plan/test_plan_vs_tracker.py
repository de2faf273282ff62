"""The planner against torch's own memory accounting (bench/plan_vs_tracker.py) on 2-layer shapes of
Llama-3.1-8B and Qwen2.5-7B, and of Llama-3.1-70B under FSDP2: the tracker counts the tensors of a
real transformers step under FakeTensorMode, the planner plans the same recipe. Every term agrees
within 2% (the bench's band is 5%): weights, gradients and optimizer states, and the train phase,
whose largest moment the planner picks (the loss's backward, the end of the forward with autocast's
copies, a layer's backward under FSDP2). docs/planner.md has the table at full size."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan_vs_tracker.py"
TOLERANCE = 0.02  # what the 2-layer shapes reach (within 1%), with room for rounding to 0.01 GiB


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("plan_vs_tracker", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(bench):
    return {r.case: r for r in bench.run(bench.CASES, layers=2)}


def test_model_states_match_the_tracker(results):
    for name, r in results.items():
        assert abs(r.error("model_states")) <= TOLERANCE, (name, r.planner, r.tracker)
        for term in ("weights", "gradients", "optimizer"):
            if term in r.planner:  # full fine-tuning: each term on its own
                assert abs(r.error(term)) <= TOLERANCE, (name, term, r.planner, r.tracker)


def test_train_phase_matches_the_tracker(results):
    """Full fine-tuning and LoRA, with and without recomputation: activations, logits, autocast's
    weight copies and the output layer's gradient at the step's peak."""
    assert len(results) == 8
    for name, r in results.items():
        assert abs(r.error("train_phase")) <= TOLERANCE, (name, r.planner, r.tracker)


def test_the_table_prints_every_case(bench, results):
    table = bench.table(list(results.values()))
    assert len(table.splitlines()) == 2 + len(bench.CASES)
    assert "Llama-3.1-8B full ckpt" in table and "model_states" in table


def test_fsdp2_matches_the_tracker(bench):
    """FSDP2 over a fake process group of 8 ranks (2-layer Llama-3.1-70B): each rank's shards of the
    weights, gradients and optimizer states, and the train phase with what FSDP2 keeps unsharded at
    a layer's backward; the group is gone afterwards."""
    import torch.distributed as dist

    (r,) = bench.run(bench.FSDP_CASES, layers=2)
    for term in ("weights", "gradients", "optimizer", "model_states", "train_phase"):
        assert abs(r.error(term)) <= TOLERANCE, (term, r.planner, r.tracker)
    assert not dist.is_initialized()


def test_selective_checkpointing_matches_the_tracker(bench, results):
    """`train.gradient_checkpointing: selective`: the tracker runs the policy the run uses
    (`stages.checkpointing`); the planner's own activation term lands on it, and what it keeps lies
    between full recomputation and none."""
    selective = {r.case: r for r in bench.run(bench.SELECTIVE_CASES, layers=2)}
    for name, r in selective.items():
        assert abs(r.error("train_phase")) <= TOLERANCE, (name, r.planner, r.tracker)
    full, none = results["Llama-3.1-8B full ckpt"], results["Llama-3.1-8B full"]
    kept = selective["Llama-3.1-8B full selective"].tracker["train_phase"]
    assert full.tracker["train_phase"] < kept < none.tracker["train_phase"]
