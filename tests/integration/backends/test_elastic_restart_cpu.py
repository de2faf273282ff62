"""Elastic restarts on two gloo processes: rank 1 is SIGKILLed after step 5 of the first attempt
(`RECIPEFORGE_FAULT=kill:1:5`; checkpoints every 3 steps). With `distributed.max_restarts=1` torch's
elastic agent starts the worker group again by itself, which resumes from checkpoint-3, runs steps 4
and 5 again (the same losses) and finishes: exit 0, final/ written. With `max_restarts=0` (the
default) the same failure ends the job with a non-zero exit. Started through `recipeforge train` (the
launcher holds the run directory's lock across attempts) and through ``torchrun -m recipeforge train
--overwrite`` (each attempt's rank 0 prepares the run directory: a restart must neither wipe it nor be
refused as another run). A restart after final/ trains nothing; a stop (SIGTERM) is not restarted.
"""

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
MAX_STEPS = 8
FAULT = {"RECIPEFORGE_FAULT": "kill:1:5"}


def _recipe_args(run: Path, cache: Path, *overrides: str) -> list[str]:
    return [str(SFT), f"output.dir={run}", f"data.cache_dir={cache}", f"train.max_steps={MAX_STEPS}",
            "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=3", "data.val_size=0",
            "logging.progress_bar=false", "distributed.backend=ddp", *overrides]


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600, env={**os.environ, **(env or {})})


def _train_losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows if r.get("split") == "train" and "loss" in r]
    assert steps == list(range(1, MAX_STEPS + 1)), steps  # every step once: the failed attempt's 4-5 were cut
    return {r["step"]: r["loss"] for r in rows if r.get("split") == "train" and "loss" in r}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("elastic-cache")


def _assert_restarted_and_finished(proc: subprocess.CompletedProcess, run: Path) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert "exitcode: -9" in output and "local_rank: 1" in output  # rank 1 really died
    assert (f"restart 1 of the worker group after a worker failed: resuming from "
            f"{run / 'checkpoints' / 'checkpoint-3'}; steps 4-5 run again") in output
    losses = [line for line in output.splitlines() if line.startswith("{'loss'")]
    assert len(losses) == MAX_STEPS + 2  # 5 steps, then 4..8 again
    assert losses[3:5] == losses[5:7]  # steps 4 and 5 of the restart repeat the failed attempt's exactly
    assert len(_train_losses(run)) == MAX_STEPS
    assert (run / "final" / "model.safetensors").is_file()
    assert not (run / "checkpoints" / ".staging").exists()


def test_a_killed_rank_restarts_the_group_which_resumes_and_finishes(tmp_path, cache):
    run = tmp_path / "run"
    proc = _run([sys.executable, "-m", "recipeforge", "train", *_recipe_args(run, cache, "distributed.max_restarts=1"),
                 "--nproc-per-node", "2"], tmp_path, FAULT)
    _assert_restarted_and_finished(proc, run)
    assert json.loads((run / "outcome.json").read_text())["kind"] == "finished"
    assert not (run / ".recipeforge.lock").exists()  # released on exit, as after any run


def test_without_restarts_the_same_failure_ends_the_job(tmp_path, cache):
    run = tmp_path / "run"
    proc = _run([sys.executable, "-m", "recipeforge", "train", *_recipe_args(run, cache), "--nproc-per-node", "2"],
                tmp_path, FAULT)
    assert proc.returncode != 0
    assert "the launcher exited with code 1 (the workers' messages are above)" in proc.stderr
    assert "restart 1" not in proc.stderr and not (run / "final").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-3"]


def test_torchrun_restart_neither_wipes_nor_refuses_the_run_directory(tmp_path, cache):
    """``--overwrite`` applies to the launch, not to each restart of it: the restarted rank 0 keeps
    checkpoint-3 and resumes from it, and the run lock of the killed attempt is taken over."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--max-restarts", "1",
           "-m", "recipeforge", "train", *_recipe_args(run, cache), "--overwrite"]
    proc = _run(cmd, tmp_path, {**FAULT, "OMP_NUM_THREADS": "1"})
    _assert_restarted_and_finished(proc, run)


def test_a_restart_after_the_run_finished_trains_nothing(tmp_path, cache):
    """Rank 1 killed after final/ was saved (`RECIPEFORGE_FAULT=exit:1`): the restarted group finds the
    run finished, trains nothing, and the command exits 0 with the run as it was."""
    run = tmp_path / "run"
    proc = _run([sys.executable, "-m", "recipeforge", "train", *_recipe_args(run, cache, "distributed.max_restarts=1"),
                 "--nproc-per-node", "2"], tmp_path, {"RECIPEFORGE_FAULT": "exit:1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "restart 1: the run finished in an earlier attempt (final/ is written); nothing to train" in proc.stderr
    assert len(_train_losses(run)) == MAX_STEPS and (run / "final" / "model.safetensors").is_file()
    assert json.loads((run / "outcome.json").read_text())["kind"] == "finished"
    assert "warning: a worker exited" not in proc.stderr


def test_a_preempted_job_stops_instead_of_restarting(tmp_path, cache):
    """SIGTERM to `recipeforge train` with restarts left: the workers save and stop, and the elastic
    agent does not start them again (a stop is no failure): exit 75, no restart."""
    import signal
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipeforge", "train",
           *_recipe_args(run, cache, "distributed.max_restarts=2", "output.save_steps=5000"), "--nproc-per-node", "2"]
    cmd = [part if part != f"train.max_steps={MAX_STEPS}" else "train.max_steps=2000" for part in cmd]
    env = {k: v for k, v in os.environ.items() if k != "RECIPEFORGE_FAULT"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").is_file() or '"loss"' not in (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err[-4000:]
    assert "stopped by SIGTERM; checkpoint saved at step" in err and "restart 1" not in err
    assert not (run / "final").exists()
