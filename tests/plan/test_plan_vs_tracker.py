"""The planner against torch's own memory accounting (bench/plan_vs_tracker.py) on 2-layer shapes of
Llama-3.1-8B and Qwen2.5-7B: the tracker counts the tensors of a real transformers step under
FakeTensorMode, the planner plans the same recipe. Weights, gradients and optimizer states agree
within 5% for full fine-tuning and LoRA; so does LoRA's train phase without recomputation. The other
train-phase figures are what the bench reports (docs/planner.md has the table at full size)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan_vs_tracker.py"


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


def test_model_states_match_the_tracker(bench, results):
    for name, r in results.items():
        assert abs(r.error("model_states")) <= bench.BAND, (name, r.planner, r.tracker)
        for term in ("weights", "gradients", "optimizer"):
            if term in r.planner:  # full fine-tuning: each term on its own
                assert abs(r.error(term)) <= bench.BAND, (name, term, r.planner, r.tracker)


def test_lora_train_phase_matches_the_tracker(bench, results):
    for name in ("Llama-3.1-8B lora", "Qwen2.5-7B lora"):
        r = results[name]
        assert abs(r.error("train_phase")) <= bench.BAND, (name, r.planner, r.tracker)


def test_the_table_prints_every_case(bench, results):
    table = bench.table(list(results.values()))
    assert len(table.splitlines()) == 2 + len(bench.CASES)
    assert "Llama-3.1-8B full ckpt" in table and "model_states" in table


def test_fsdp2_model_states_match_the_tracker(bench):
    """FSDP2 over a fake process group of 8 ranks (2-layer Llama-3.1-70B): each rank's shards of the
    weights, gradients and optimizer states as the planner counts them; the group is gone afterwards."""
    import torch.distributed as dist

    (r,) = bench.run(bench.FSDP_CASES, layers=2)
    for term in ("weights", "gradients", "optimizer", "model_states"):
        assert abs(r.error(term)) <= bench.BAND, (term, r.planner, r.tracker)
    assert not dist.is_initialized()
