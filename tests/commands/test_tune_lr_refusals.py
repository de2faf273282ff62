"""`recipeforge tune lr` refuses, as typed, what it cannot run: a range that does not rise, too few steps, a
recipe planned for several processes, a GRPO recipe; exit 2, the reason at the flag or key, no traceback, and
no run directory written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def tune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", "tune", "lr", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize(("flags", "said"), [
    (["--start", "1e-2", "--end", "1e-3"], "--start: must be below --end (0.01 >= 0.001)"),
    (["--start", "0.1", "--end", "0.1"], "--start: must be below --end"),
    (["--start", "0", "--end", "1"], "--start: --start and --end must be positive"),
    (["--steps", "9"], "--steps: must be 10 or more (got 9)"),
])
def test_a_bad_range_exits_2_with_the_reason(tmp_path, flags, said):
    proc = tune(tmp_path, str(RECIPE), f"output.dir={tmp_path / 'run'}", *flags)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run-lr-range").exists()


def test_a_multi_process_plan_is_refused(tmp_path):
    proc = tune(tmp_path, str(RECIPE), f"output.dir={tmp_path / 'run'}", "hardware.gpus_per_node=2",
                "hardware.gpu=H100-80GB")
    assert proc.returncode == 2, proc.stderr
    assert "distributed.backend: the range test runs in this one process" in proc.stderr
    assert "plans 2 processes" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run-lr-range").exists()


@pytest.mark.parametrize("stage", ["grpo", "rloo"])
def test_rollout_stages_are_refused(tmp_path, stage):
    recipe = ROOT / "examples" / "yaml" / "tiny" / f"{stage}.yaml"
    proc = tune(tmp_path, str(recipe), f"output.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr
    assert "stage: the range test reads a training loss" in proc.stderr and "Traceback" not in proc.stderr
    assert f"{stage}'s loss is a policy objective" in proc.stderr


def test_tune_without_what_to_tune_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "tune"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "lr" in proc.stderr and "Traceback" not in proc.stderr
