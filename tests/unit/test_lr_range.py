"""stages/lr_range.py: the range test's rates, smoothing, divergence stop, the steep rule and its files."""

from __future__ import annotations

import json
import math
import sys

import pytest

from recipeforge.stages import lr_range
from recipeforge.stages.lr_range import RangeResult, rates, smooth, suggest


def test_rates_rise_exponentially_from_start_to_end():
    lrs = rates(1e-7, 1.0, 100)
    assert len(lrs) == 100 and lrs[0] == pytest.approx(1e-7) and lrs[-1] == pytest.approx(1.0)
    ratios = {round(b / a, 9) for a, b in zip(lrs, lrs[1:])}
    assert len(ratios) == 1  # evenly spaced in log scale


def test_smoothing_is_fastais_bias_corrected_average():
    assert smooth([5.0, 5.0, 5.0]) == pytest.approx([5.0, 5.0, 5.0])  # no pull towards 0 at the start
    out = smooth([4.0, 2.0])
    assert out[1] == pytest.approx((0.98 * 0.02 * 4.0 + 0.02 * 2.0) / (1 - 0.98 ** 2))


def test_the_steep_rule_picks_the_steepest_fall_against_log_rate():
    lrs = rates(1e-5, 1e-1, 40)
    # flat, then the fastest fall around index 25, then a rise
    curve = [5.0 - 3.0 / (1 + math.exp(-(i - 25) / 1.5)) + (0.2 * (i - 33) ** 2 if i > 33 else 0) for i in range(40)]
    rate, index = suggest(lrs, curve)
    assert index == 25 and rate == lrs[25]
    assert suggest(lrs[:2], curve[:2]) is None


def test_the_test_stops_at_four_times_the_best_smoothed_loss_and_suggests_before_it():
    result = RangeResult(start=1e-6, end=1.0, steps=60)
    lrs = rates(1e-6, 1.0, 60)
    stopped = None
    for i, lr in enumerate(lrs):
        loss = 6.0 - 0.1 * i if i < 40 else 2.0 + 40.0 * (i - 39)
        if result.add(lr, loss):
            stopped = i
            break
    assert stopped is not None and 40 <= stopped < 60
    assert result.diverged_at == lrs[stopped]
    result.finish()
    assert result.suggestion is not None and result.suggestion < result.diverged_at


def test_a_nan_loss_is_divergence():
    result = RangeResult(start=1e-6, end=1.0, steps=20)
    for lr in rates(1e-6, 1e-3, 5):
        assert not result.add(lr, 3.0)
    assert result.add(1e-2, float("nan"))
    assert json.loads(json.dumps(result.to_dict()))["losses"][-1] is None


def test_without_matplotlib_the_json_is_written_and_the_plot_is_said_missing(tmp_path, monkeypatch):
    result = RangeResult(start=1e-6, end=1.0, steps=20, lrs=[1e-6, 1e-5, 1e-4], losses=[3.0, 2.0, 1.0],
                         smoothed=[3.0, 2.5, 2.0], suggestion=1e-5)
    said: list[str] = []
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    json_path, png = lr_range.write_files(result, tmp_path, said.append)
    assert png is None and not (tmp_path / "lr_range.png").exists()
    assert json.loads(json_path.read_text())["suggestion"] == 1e-5
    assert "matplotlib is not installed" in said[0]


def test_the_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    result = RangeResult(start=1e-6, end=1.0, steps=20, lrs=[1e-6, 1e-5, 1e-4], losses=[3.0, 2.0, 1.0],
                         smoothed=[3.0, 2.5, 2.0], suggestion=1e-5)
    _, png = lr_range.write_files(result, tmp_path, print)
    assert png is not None and png.read_bytes()[:4] == b"\x89PNG"
