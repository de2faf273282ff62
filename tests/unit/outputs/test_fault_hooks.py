"""Fault injection costs nothing on the training hot path: RECIPEFORGE_FAULT is read when training
starts (and when the callbacks are built), never on each step."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.outputs import atomic
from recipeforge.stages import divergence


class CountingEnviron(MutableMapping):
    """os.environ that counts lookups of RECIPEFORGE_FAULT."""

    def __init__(self, base):
        self.base, self.reads = dict(base), 0

    def __getitem__(self, key):
        if key == "RECIPEFORGE_FAULT":
            self.reads += 1
        return self.base[key]

    def get(self, key, default=None):
        if key == "RECIPEFORGE_FAULT":
            self.reads += 1
        return self.base.get(key, default)

    def __setitem__(self, key, value):
        self.base[key] = value

    def __delitem__(self, key):
        del self.base[key]

    def __iter__(self):
        return iter(self.base)

    def __len__(self):
        return len(self.base)


class _Trainer:
    """The two methods the crash-safe mixin wraps on the step path."""

    def __init__(self):
        self.state = SimpleNamespace(global_step=0)
        self.steps = 0

    def train(self, *args, **kwargs):
        for _ in range(100):
            self.training_step()
            self.state.global_step += 1
        return "trained"

    def training_step(self, *args, **kwargs):
        self.steps += 1


@pytest.fixture
def environ(monkeypatch):
    env = CountingEnviron({k: v for k, v in os.environ.items() if k != "RECIPEFORGE_FAULT"})
    monkeypatch.setattr(os, "environ", env)
    return env


def test_training_steps_do_not_read_the_fault_variable(environ):
    trainer = atomic.crash_safe(_Trainer)()
    assert trainer.train() == "trained" and trainer.steps == 100
    assert environ.reads == 1  # once, when training started


def test_a_set_fault_still_fires_at_its_step(environ, monkeypatch):
    environ["RECIPEFORGE_FAULT"] = "oom:3"
    trainer = atomic.crash_safe(_Trainer)()
    with pytest.raises(Exception, match="out of memory"):
        trainer.train()
    assert trainer.state.global_step == 3


def test_the_divergence_callback_reads_the_fault_variable_once(environ, tmp_path):
    config = SimpleNamespace(spike_factor=3.0, spike_window=10, spike_patience=3, on_spike="warn", stop_on_nan=False)
    cb = divergence.make_callback(config, stage="sft", checkpoints=Path(tmp_path), log=print)
    for step in range(100):
        cb.on_step_begin(None, SimpleNamespace(global_step=step), None, model=None)
    assert environ.reads == 1
