"""The memory model against published, measured peak-memory figures of fine-tuning runs.

Each recipe under tests/plan/published/ reproduces one published run and names its source, the
figure and what the figure counts (allocated, reserved or device memory). Every recipe not excluded
is planned on its published hardware; the aggregate must meet the targets the planner documents
(docs/planner.md, "Calibration"). Excluded figures are kept with the reason they do not measure the
run recipeforge would make, and are still evaluated so the table in the docs shows them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("plan_calibration", ROOT / "bench" / "plan_calibration.py")
calibration = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("plan_calibration", calibration)  # dataclasses look their module up there
_spec.loader.exec_module(calibration)

RECIPES = sorted(calibration.PUBLISHED.glob("*.yaml"))
CASE_BOUND = 0.25  # no single calibrated figure may be missed by more than this


@pytest.fixture(scope="module")
def rows():
    return calibration.evaluate()


def test_every_recipe_names_its_source_and_what_the_figure_counts():
    assert len(RECIPES) >= 15
    for path in RECIPES:
        meta, source, setting = calibration._header(path)
        assert source and setting, path.name
        assert meta["unit"] in ("GiB", "GB") and meta["measure"] in ("allocated", "reserved", "device"), path.name
        assert float(meta["published"]) > 0, path.name


def test_at_least_fifteen_figures_are_calibrated(rows):
    used = [r for r in rows if not r.excluded]
    assert len(used) >= 15
    # several engines and scales, not one setting repeated
    assert {r.plan.split(",")[0].split()[0] for r in used} >= {"single", "deepspeed", "fsdp"}


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_each_published_run_is_planned_close_to_its_figure(path, rows):
    row = next(r for r in rows if r.name == path.stem)
    if row.excluded:
        assert len(row.excluded) > 30  # a reason, not a placeholder
        return
    assert row.estimate_gib is not None, f"{row.name} was refused: {row.refusal}"
    assert abs(row.error) <= CASE_BOUND, (f"{row.name}: published {row.published_gib:.1f} GiB ({row.measure}), "
                                          f"estimate {row.estimate_gib:.1f} GiB ({row.error:+.0%})")


def test_aggregate_meets_the_documented_targets(rows):
    # over every published figure, fitting and held-out together (the held-out half alone is held to
    # the same targets in test_heldout_calibration.py); the fitting half is reported with them
    agg = calibration.aggregate(rows + calibration.evaluate(folder=calibration.HELDOUT))
    assert agg["refused"] == []
    assert agg["median_abs_error"] <= 0.10, agg
    assert agg["within_15pct"] >= 0.80, agg
    assert calibration.aggregate(rows)["median_abs_error"] <= 0.10


def test_measured_view_removes_what_a_figure_does_not_count():
    from recipeforge.plan.memory import measured_view

    gb = {"weights": 10.0, "runtime": 0.75, "allocator_reserve": 1.0, "total": 20.0}
    assert measured_view(gb, "device") == 20.0
    assert measured_view(gb, "reserved") == pytest.approx(19.25)
    assert measured_view(gb, "allocated") == pytest.approx(18.25)
    with pytest.raises(ValueError):
        measured_view(gb, "nvidia-smi")
