"""metrics.jsonl writing, reading and trimming on resume."""

from __future__ import annotations

import math

from recipeforge.outputs.metrics import MetricsWriter, read_metrics, series


def test_write_read_and_series(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl")
    w.write({"split": "train", "step": 1, "loss": 2.0})
    w.write({"split": "eval", "step": 1, "eval_loss": 3.0})
    w.write({"split": "train", "step": 2, "loss": math.nan, "lr": 1e-3})
    recs = read_metrics(tmp_path / "m.jsonl")
    assert len(recs) == 3 and all("time" in r for r in recs)
    assert recs[2]["loss"] is None  # non-finite values become null, the line stays valid JSON
    assert series(recs, "loss") == [2.0] and series(recs, "eval_loss", "eval") == [3.0]


def test_truncate_after_a_step(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl")
    for step in (0, 5, 10, 15):
        w.write({"split": "train", "step": step})
    w.truncate_after(10)
    assert [r["step"] for r in read_metrics(tmp_path / "m.jsonl")] == [0, 5, 10]


def test_disabled_writer_writes_nothing(tmp_path):
    MetricsWriter(tmp_path / "m.jsonl", enabled=False).write({"step": 1})
    assert not (tmp_path / "m.jsonl").exists()
