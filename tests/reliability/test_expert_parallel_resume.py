"""An expert-parallel run (the tiny Qwen3-MoE on two gloo processes, experts split 4 + 4) SIGKILLed in
the middle resumes from its last checkpoint and continues the curve of the run that was never killed:
the checkpoint holds the sharded model and optimizer state (torch DCP, one shard per rank), the
scheduler and every rank's RNG state, so the resumed steps give the same floats. The same checkpoint
resumed at another expert-parallel size (one process) is refused with exit 2, naming the size to use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.backends.test_expert_parallel_cpu import EP, RECIPE, VARIANT

pytestmark = pytest.mark.slow


def train(tiny, run: Path, *overrides: str, nproc: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """`recipeforge train` of the tiny MoE recipe in a fresh process (as typed), `nproc` gloo processes."""
    cmd = [sys.executable, "-m", "recipeforge", "train", str(RECIPE), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", "logging.progress_bar=false", *VARIANT, *overrides]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=run.parent, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def test_killed_expert_parallel_run_resumes_on_the_curve(tiny, tmp_path):
    from safetensors.torch import load_file

    whole = tmp_path / "whole"
    ok(train(tiny, whole, *EP))
    run = tmp_path / "killed"
    proc = train(tiny, run, *EP, env={"RECIPEFORGE_FAULT": "step:5"})
    assert proc.returncode != 0 and "SIGKILL" in proc.stderr  # both ranks killed at step 5
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-3"]
    ckpt = run / "checkpoints" / "checkpoint-3"
    assert {p.name for p in (ckpt / "expert_parallel").glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}
    assert {"scheduler.pt", "rng_state_0.pth", "rng_state_1.pth", "expert_parallel.json"} <= \
        {p.name for p in ckpt.iterdir()}

    resumed = ok(train(tiny, run, *EP))
    assert f"resuming from {ckpt}" in resumed.stderr
    # steps 4-6 trained again from the checkpoint: the optimizer's moments restored (a fresh optimizer
    # would change step 5 on), the same batches in the same order
    assert tiny.values(run, "loss") == tiny.values(whole, "loss")
    assert tiny.values(run, "grad_norm") == tiny.values(whole, "grad_norm")
    want, got = load_file(whole / "final" / "model.safetensors"), load_file(run / "final" / "model.safetensors")
    assert want.keys() == got.keys() and all((want[k] == got[k]).all() for k in want)


def test_resume_at_another_expert_parallel_size_is_refused(tiny, tmp_path):
    run = tmp_path / "ep2"
    ok(train(tiny, run, *EP, "train.max_steps=3"))
    # one process, no expert parallel, the same run directory (--force: the recipe changed on purpose)
    proc = train(tiny, run, "distributed.backend=fsdp", "train.max_steps=6", "--force", nproc=1)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "distributed.expert_parallel" in proc.stderr and "saved with expert parallel 2" in proc.stderr
    assert "distributed.expert_parallel: 2" in proc.stderr and "--nproc-per-node 2" in proc.stderr
    assert "Traceback" not in proc.stderr.split("error:")[-1]
