"""Data preparation that outlasts the process-group timeout does not stop a multi-process job.

Two gloo processes started directly by torchrun (no launching `recipeforge train` that could tokenize
first), a process-group timeout of 6 seconds (`distributed.timeout_minutes=0.1`) and data preparation
made 15 seconds slower by ``RECIPEFORGE_FAULT=slow_tokenize:15``: rank 1 waits for rank 0's data
outside any collective, so the job trains. When rank 0's preparation fails after that long, rank 1
stops with rank 0's error instead of a timeout. Through `recipeforge train --nproc-per-node 2` the
launching process tokenizes before any worker starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.backends.launcher_command import launcher_command

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
# torchrun of this Python, as recipeforge starts it: the script beside it, or `python -m torch.distributed.run`
# in a virtual environment on top of another one, whose bin/ has no launcher scripts.
TORCHRUN = launcher_command("torchrun", "torch.distributed.run")
SHORT = ("distributed.timeout_minutes=0.1", "train.max_steps=2", "train.micro_batch_size=auto",
         "train.logging_steps=1", "output.save_steps=100", "data.val_size=0", "logging.progress_bar=false")


def _torchrun(tmp_path: Path, *overrides: str, delay: int = 15) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECIPEFORGE_FAULT": f"slow_tokenize:{delay}"}
    cmd = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "-m", "recipeforge", "train", str(SFT),
           f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}", *SHORT, *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)


def test_slow_data_preparation_outlasts_the_process_group_timeout(tmp_path):
    proc = _torchrun(tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    run = tmp_path / "run"
    assert (run / "final" / "model.safetensors").is_file()
    assert list((tmp_path / "cache" / "tokenized").iterdir())  # rank 0 built the cache the others read
    assert "timed out" not in proc.stderr.lower() and "timeout" not in proc.stderr.lower()


def test_a_data_error_on_rank_0_reaches_the_waiting_rank(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "answer": "b"}\n' * 8)  # alpaca rows without `output`
    proc = _torchrun(tmp_path, f"data.datasets=[{{path: {bad}, format: alpaca}}]", delay=10)
    assert proc.returncode != 0
    # Both ranks report the data problem (rank 1 from rank 0's failure marker), neither a timeout.
    assert proc.stderr.count("format 'alpaca' needs column 'output'") == 2, proc.stderr[-6000:]
    assert "timed out" not in proc.stderr.lower(), proc.stderr[-6000:]


def test_the_launching_command_tokenizes_before_the_workers_start(tmp_path):
    env = {**os.environ, "RECIPEFORGE_FAULT": "slow_tokenize:15"}
    cmd = [sys.executable, "-m", "recipeforge", "train", str(SFT), f"output.dir={tmp_path / 'run'}",
           f"data.cache_dir={tmp_path / 'cache'}", *SHORT, "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    before, _, after = proc.stderr.partition("launching accelerate:")
    assert "cache=miss" in before  # tokenized by the launching command ...
    assert "cache=hit" in after and "cache=miss" not in after  # ... and only read by the workers
