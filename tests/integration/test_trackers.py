"""Experiment trackers write into the run directory and need no network (wandb offline mode)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow


def test_tensorboard_events_in_the_run_dir(tiny, tmp_path):
    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=3", "logging.tensorboard=true")
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb (the `wandb` extra)")
def test_wandb_offline_keeps_everything_in_the_run_dir(tiny, tmp_path):
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != "WANDB_SERVICE"}
    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=3", "logging.wandb.project=tiny",
                     "logging.wandb.mode=offline")
    offline_runs = list((run / "wandb").rglob("offline-run-*"))
    assert offline_runs and any(p.suffix == ".wandb" for p in offline_runs[0].iterdir())
    after = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != "WANDB_SERVICE"}
    assert after == before  # the tracker's settings do not leak into later runs
