"""What a training run prints: a progress line with step/total, loss, tokens per second and ETA, and
no library warnings on the console (they go to RUN/logs/warnings.log; --verbose shows them).

The tiny LoRA recipe makes transformers raise a real FutureWarning (``is_gradient_checkpointing`` is
deprecated) on every run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
PROGRESS = re.compile(r"^\[recipeforge\] step +(\d+)/(\d+) \| loss (\d+\.\d{4}) \| ([\d,]+) tok/s \| "
                      r"ETA \d+:\d\d:\d\d$", re.M)


def _train(tiny, tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    run = tmp_path / "run"
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **env}
    if "RECIPEFORGE_VERBOSE" not in env:
        full_env.pop("RECIPEFORGE_VERBOSE", None)
    cmd = [sys.executable, "-m", "recipeforge", *args, "train", str(LORA), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", "train.max_steps=6", "train.logging_steps=1", "output.save_steps=100"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=full_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, run


def test_progress_line_and_library_warnings_in_the_run_dir(tiny, tmp_path):
    proc, run = _train(tiny, tmp_path)
    lines = PROGRESS.findall(proc.stderr)
    # Not a terminal: plain lines, the first step and the last one (no more than every 30 seconds between).
    assert [(int(step), int(total)) for step, total, _, _ in lines][0] == (1, 6)
    assert [(int(step), int(total)) for step, total, _, _ in lines][-1] == (6, 6)
    assert float(lines[-1][2]) < float(lines[0][2])  # the loss it shows is the run's, falling
    assert float(lines[-1][2]) == pytest.approx(tiny.values(run, "loss")[-1], abs=1e-4)
    assert all(int(tps.replace(",", "")) > 0 for _, _, _, tps in lines)
    assert "\r" not in proc.stderr.replace("\r\n", "\n").split("[recipeforge] step")[1]  # no in-place updates
    assert "{'loss'" not in proc.stdout + proc.stderr  # the trainer's log dictionaries are replaced too
    # The library's FutureWarning is in the run's warnings log, not on the console.
    assert "FutureWarning" not in proc.stderr
    log = (run / "logs" / "warnings.log").read_text()
    assert "FutureWarning: `is_gradient_checkpointing` is deprecated" in log
    assert f"written to {run / 'logs' / 'warnings.log'}" in proc.stderr


def test_verbose_shows_library_warnings_again(tiny, tmp_path):
    proc, run = _train(tiny, tmp_path, "--verbose")
    assert "FutureWarning: `is_gradient_checkpointing` is deprecated" in proc.stderr
    assert not (run / "logs" / "warnings.log").exists()
