"""A worker that ends badly after the run finished (every rank saved final/ and left the process group)
is a visible warning, not a failure and not a silent success: the command exits 0, says so on the
console, and outcome.json keeps it. Two gloo processes, rank 1 killed right after the run finished
(`RECIPEFORGE_FAULT=exit:1`). The outcome of a clean two-process run is checked by the DDP launch of
test_multiprocess_cpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def test_a_worker_killed_after_the_run_finished_is_a_warning(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(SFT), f"output.dir={run}",
           f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=2", "train.micro_batch_size=auto",
           "data.val_size=0", "logging.progress_bar=false", "distributed.backend=ddp", "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                          env={**os.environ, "RECIPEFORGE_FAULT": "exit:1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning: a worker exited with code" in proc.stderr and "after the run finished" in proc.stderr
    assert (run / "final" / "model.safetensors").is_file()
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["kind"] == "finished" and "exited with code" in outcome["message"]
