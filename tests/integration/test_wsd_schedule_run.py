"""`scheduler: wsd` in real training runs: the learning rate logged at every step has a warmup, a
stable peak and a decay over `train.decay_ratio` of the run's steps, whether the run's length is given
as `max_steps` or as `epochs` (then the trainer counts the steps)."""

from __future__ import annotations

import pytest

from recipeforge.components.schedules import wsd_factor, wsd_phases

pytestmark = pytest.mark.slow

PEAK = 3.0e-3


def _lr_curve(tiny, tmp_path, *overrides) -> dict[int, float]:
    run = tiny.train("sft-full", tmp_path / "run", "train.scheduler=wsd", f"train.learning_rate={PEAK}",
                     "train.logging_steps=1", "output.save_steps=1000", "data.val_size=0", "train.eval_steps=null",
                     *overrides)
    return {r["step"]: r["learning_rate"] for r in tiny.records(run, "train") if "learning_rate" in r}


def _check(curve: dict[int, float], total: int, warmup: int, decay_ratio: float):
    phases = wsd_phases(total, warmup, decay_ratio)
    assert max(curve) == total and abs(phases.decay - decay_ratio * total) <= 0.5
    # The trainer logs, at step s (1-based), the rate that step ran with: optimizer step s - 1.
    rate = {s - 1: lr for s, lr in curve.items()}
    assert sorted(rate) == list(range(total))
    for step, lr in rate.items():
        assert lr == pytest.approx(PEAK * wsd_factor(step, phases)), (step, curve)
    # Warmup below the peak; the peak from step `warmup` up to the first decay step; then the rate
    # falls at every step of the last decay_ratio share of the run.
    assert all(rate[s] < PEAK for s in range(warmup))
    stable = [s for s, lr in rate.items() if lr == pytest.approx(PEAK)]
    assert stable == list(range(warmup, phases.decay_start + 1))
    decay = [rate[s] for s in range(phases.decay_start, total)]
    assert len(decay) == phases.decay and all(a > b for a, b in zip(decay, decay[1:]))
    assert decay[-1] < 0.1 * PEAK
    return phases


def test_wsd_with_max_steps(tiny, tmp_path):
    curve = _lr_curve(tiny, tmp_path, "train.max_steps=40", "train.warmup_steps=4", "train.decay_ratio=0.25")
    phases = _check(curve, 40, 4, 0.25)
    assert (phases.warmup, phases.stable, phases.decay) == (4, 26, 10)


def test_wsd_with_epochs_decays_over_the_same_share(tiny, tmp_path):
    # No max_steps: the number of optimizer steps comes from the data and the epochs.
    curve = _lr_curve(tiny, tmp_path, "train.max_steps=null", "train.epochs=10", "train.warmup_steps=2",
                      "train.decay_ratio=0.25")
    total = max(curve)
    assert total >= 16  # several steps per epoch: the decay is more than the last step
    phases = _check(curve, total, 2, 0.25)
    assert phases.stable > 0 and phases.decay >= 4
