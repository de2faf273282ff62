"""The planner's accuracy bands are the measured spread of the published figures, not constants: the
committed recipeforge/plan/accuracy_bands.py must equal what `bench/plan_calibration.py --write-bands`
derives from tests/plan/published/ and published_heldout/ now (a figure added or a model change that
moves the spread makes this fail until the bands are written again), and every plan states its class."""

from __future__ import annotations


def test_the_committed_bands_are_the_measured_spread(calibration):
    rows = calibration.all_rows()
    found, counts = calibration.bands(rows)
    assert calibration.BANDS_MODULE.read_text() == calibration.bands_module(found, counts), \
        "the bands no longer match the figures: run `python bench/plan_calibration.py --write-bands`"
    assert set(found) == {"calibrated", "sharded"} and all(n >= calibration.MIN_FIGURES for n in counts.values())


def test_a_band_holds_its_share_of_the_figures(calibration):
    from recipeforge.plan.accuracy_bands import BANDS

    rows = [r for r in calibration.all_rows() if not r.excluded and r.estimate_gib and r.band_class in BANDS]
    for name, band in BANDS.items():
        mine = [r for r in rows if r.band_class == name]
        inside = [r for r in mine if abs(r.published_gib / r.estimate_gib - 1) <= band]
        assert len(inside) >= calibration.PERCENTILE * len(mine), (name, band, len(inside), len(mine))
