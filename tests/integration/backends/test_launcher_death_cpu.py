"""kill -9 of the launching `recipeforge train` leaves no worker behind: the launcher it started stops its
workers, which save a checkpoint at the next step boundary and exit; the run directory's lock is free
within seconds, and the same command resumes from that checkpoint and finishes.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def _command(run: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "recipeforge", "train", str(SFT), f"output.dir={run}", f"data.cache_dir={cache}",
            "train.max_steps=400", "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=1000",
            "data.val_size=0", "logging.progress_bar=false", "distributed.backend=ddp", "--nproc-per-node", "2"]


def _processes_of(run: Path) -> list:
    """Every live process started for this run (the launcher and its workers name the run directory)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if any(str(run) in part for part in proc.info["cmdline"] or ()) and proc.info["status"] != "zombie":
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _train_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if r.get("split") == "train" and "loss" in r]


def test_killing_the_launching_command_ends_its_workers_and_the_run_resumes(tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    launching = subprocess.Popen(_command(run, cache), cwd=tmp_path, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not _train_steps(run):  # training has started on both ranks
            assert launching.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no training step within 5 minutes"
            time.sleep(0.2)
        assert len(_processes_of(run)) >= 3  # the launcher and two workers
        os.kill(launching.pid, signal.SIGKILL)
        launching.wait()
        deadline = time.monotonic() + 60
        while _processes_of(run):
            assert time.monotonic() < deadline, f"orphans still running: {[p.pid for p in _processes_of(run)]}"
            time.sleep(0.2)
    finally:
        for proc in _processes_of(run):
            proc.kill()
    # No process holds the run directory any more. A process still exiting has dropped its command line
    # (its memory goes before its files), so the lock may outlive the last match for a moment.
    deadline = time.monotonic() + 30
    with open(run / ".recipeforge.lock", "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "the run directory is still locked 30 s after its processes"
                time.sleep(0.2)
        fcntl.flock(lock, fcntl.LOCK_UN)
    saved = sorted((run / "checkpoints").glob("checkpoint-*"))
    assert saved, "the workers stopped without saving"  # they took the preemption path
    stopped_at = int(saved[-1].name.split("-")[1])
    assert 0 < stopped_at < 400 and not (run / "final").exists()

    again = subprocess.run(_command(run, cache), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"resuming from {saved[-1]}" in again.stderr
    steps = _train_steps(run)
    assert steps[-1] == 400 and stopped_at + 1 in steps
    assert (run / "final" / "config.json").is_file()
