"""Fit by the estimate's accuracy band, not by a fixed share: a run whose estimate is above
`distributed.memory_headroom` of the GPU but whose band's low end fits is planned with a warning; one
whose low end does not fit is refused. The commands as a user types them."""

from __future__ import annotations

from pathlib import Path

from recipeforge.cli import main

ROOT = Path(__file__).resolve().parents[3]
# Llama-3.2-3B full SFT, packed, one GPU (torchtune's published run): the estimate grows with the
# sequence length, which moves it across the margin and then past the band.
RECIPE = ROOT / "tests" / "plan" / "published" / "tt-llama3.2-3b-full-packed.yaml"
PINNED = ["--hardware", "1xA100-80GB", "train.gradient_checkpointing=false"]


def _plan(capsys, *overrides: str) -> tuple[int, str]:
    code = main(["plan", str(RECIPE), *PINNED, *overrides])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_inside_the_margin_no_warning(capsys):
    code, out = _plan(capsys)
    assert code == 0 and "tight fit" not in out


def test_above_the_margin_but_within_the_band_plans_with_a_warning(capsys):
    code, out = _plan(capsys, "data.sequence_len=5632")
    assert code == 0, out
    line = next(line for line in out.splitlines() if "tight fit: the estimate is" in line)
    # the decision says the fit is tight, not that the estimate "fits in" less than itself
    backend = next(line for line in out.splitlines() if line.strip().startswith("backend "))
    assert "a tight fit: " in backend and "see the warning" in backend and "fits in" not in backend, backend
    # the numbers: the estimate with its band, the margin it exceeds and the band's low end
    from recipeforge.plan.accuracy_bands import BANDS

    band = BANDS["calibrated"]  # one GPU: the measured spread of that class
    assert f"GB per GPU (±{band:.0%})" in line and "90% of the 80.0 GB GPU" in line and "72.0 GB" in line
    assert "low end of the band" in line


def test_beyond_the_band_is_refused(capsys):
    code, out = _plan(capsys, "data.sequence_len=8192")
    assert code == 2 and "does not fit" in out and "tight fit" not in out


def test_a_stricter_margin_moves_the_warning_not_the_refusal(capsys):
    code, out = _plan(capsys, "distributed.memory_headroom=0.7")
    assert code == 0 and "tight fit" in out and "70% of the 80.0 GB GPU" in out
