"""Preparing the data of a launched job: the waiting ranks poll marker files, and a failure on the
preparing rank reaches them with its message (a recipe mistake as the same located problems)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest

from recipeforge.backends import data_ready
from recipeforge.backends.ddp import unused_parameter_kwargs
from recipeforge.backends.worker import process_group_timeout
from recipeforge.errors import Location, Problem, RecipeError
from recipeforge.plan.types import PlanExtras


def _info(rank, local_rank):
    return SimpleNamespace(rank=rank, local_rank=local_rank, is_main=rank == 0)


class _Runner:
    def __init__(self, fail=None, delay=0.0):
        self.fail, self.delay, self.tokenizer, self.data_stats = fail, delay, None, {}

    def prepare(self):
        """What `TrainerStage.prepare` does: the tokenizer, then the data."""
        self.tokenizer = "tokenizer"
        time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.data_stats = {"cache": "miss"}
        return self.data_stats


def _two_ranks(runner, monkeypatch, tmp_path):
    """Rank 0 (builder) and rank 1 (waiter) of one machine, as threads; returns each one's exception."""
    monkeypatch.setattr(data_ready.tempfile, "gettempdir", lambda: str(tmp_path))
    token, barrier, errors, logs = "abc123", threading.Barrier(2, timeout=10), {}, []

    def rank(r):
        try:
            data_ready.prepare_on_first_rank(lambda: runner, _info(r, r), broadcast=lambda _: token,
                                             barrier=barrier.wait, log=logs.append, poll=0.01)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors[r] = exc
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return errors


def test_the_waiting_rank_continues_once_the_data_is_ready(monkeypatch, tmp_path):
    runner = _Runner(delay=0.3)
    assert _two_ranks(runner, monkeypatch, tmp_path) == {}
    assert runner.tokenizer == "tokenizer" and runner.data_stats == {"cache": "miss"}
    assert not (tmp_path / "recipeforge-data-abc123").exists()  # markers removed after the barrier


def test_a_recipe_mistake_reaches_the_waiting_rank_as_itself(monkeypatch, tmp_path):
    problem = Problem("format 'alpaca' needs column 'output'", Location("r.yaml", 3, 5), "data.datasets[0].format",
                      "rename the column")
    errors = _two_ranks(_Runner(fail=RecipeError([problem]), delay=0.2), monkeypatch, tmp_path)
    assert isinstance(errors[1], RecipeError) and errors[1].problems == [problem]
    assert errors[0].problems == [problem]


def test_any_other_failure_names_the_rank(monkeypatch, tmp_path):
    errors = _two_ranks(_Runner(fail=OSError("disk full")), monkeypatch, tmp_path)
    assert isinstance(errors[0], OSError)
    assert "rank 0 failed while preparing the data: OSError: disk full" in str(errors[1])


def test_wait_for_reads_only_whole_markers(tmp_path):
    done, failed = tmp_path / "rank0.done", tmp_path / "rank0.failed"
    data_ready._publish(failed, json.dumps({"error": "boom"}))
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(RecipeError, match="rank 0 failed while preparing the data: boom"):
        data_ready.wait_for(done, failed, builder=0, log=print, poll=0.01)


def test_slow_tokenize_fault_is_parsed_and_free_when_unset():
    assert data_ready.injected_delay("") == 0.0
    assert data_ready.injected_delay("slow_tokenize:2.5") == 2.5
    assert data_ready.injected_delay("step:3") == 0.0
    assert data_ready.injected_delay("slow_tokenize:x") == 0.0


def test_process_group_timeout_is_the_recipe_value():
    assert process_group_timeout(0.05).total_seconds() == 3.0
    assert process_group_timeout(60).total_seconds() == 3600.0


def test_ddp_searches_for_unused_parameters_only_for_models_with_towers():
    def plan(model_type, ckpt=False):
        return SimpleNamespace(extra=PlanExtras(model={"model_type": model_type}), gradient_checkpointing=ckpt)

    assert unused_parameter_kwargs(plan("llama")) == {"ddp_find_unused_parameters": False}
    towers = unused_parameter_kwargs(plan("gemma3", ckpt=True))
    assert towers["ddp_find_unused_parameters"] is True
    assert {"use_reentrant": False} in towers.values()  # reentrant checkpointing and the search clash
