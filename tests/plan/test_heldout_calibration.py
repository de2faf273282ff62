"""The held-out published figures (tests/plan/published_heldout/): chosen before the memory model was
planned on them and never used to fit it. Every one is a run that really ran, so none may be refused,
and their accuracy is the planner's stated accuracy (`bench/plan_calibration.py --set heldout`,
docs/planner.md): median |error| at most 10%, at least 80% within ±15%."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def rows(calibration):
    return calibration.evaluate(folder=calibration.HELDOUT)


def test_no_held_out_run_is_refused(rows):
    assert len(rows) >= 16
    assert [r.name for r in rows if r.estimate_gib is None and not r.excluded] == []


def test_held_out_accuracy_meets_the_targets(rows, calibration):
    agg = calibration.aggregate(rows)
    assert agg["refused"] == [] and agg["cases"] >= 25
    assert agg["median_abs_error"] <= 0.10, agg
    assert agg["within_15pct"] >= 0.80, agg


def test_every_held_out_figure_names_its_source_and_setting(rows):
    for r in rows:
        assert r.source and r.setting and r.published_gib > 0, r.name
        assert r.measure in ("allocated", "reserved", "device"), r.name
