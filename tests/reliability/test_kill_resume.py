"""A run SIGKILLed at any point (inside a checkpoint save included) resumes from a complete checkpoint,
and its final weights equal those of a run that was never interrupted.

The kill points come from `RECIPEFORGE_FAULT` (see recipeforge/outputs/atomic.py), so each crash
happens at exactly the same place on every machine. Tolerance: allclose with rtol=1e-5, atol=1e-6 —
resume restores weights, optimizer, scheduler, RNG and data position, so any real divergence (a
skipped or repeated batch, a lost optimizer state) is orders of magnitude larger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.outputs.checkpoint import newest_complete, step_of

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "examples" / "data" / "sft-alpaca.jsonl"

RECIPE = f"""\
stage: sft
model: {{name_or_path: "tiny:llama"}}
hardware: {{gpus_per_node: 0}}
data:
  datasets: [{{path: "{DATA}", format: alpaca}}]
  sequence_len: 128
  packing: true
train:
  max_steps: 12
  global_batch_size: 4
  micro_batch_size: 4
  learning_rate: 3.0e-3
  logging_steps: 2
logging: {{progress_bar: false}}
output:
  save_steps: 4
  save_total_limit: 2
"""

# (fault point, newest complete checkpoint expected after the kill)
CRASHES = [
    ("step:2", None),             # killed mid-training before any checkpoint
    ("save-partial:4", None),     # killed inside the first save: weights written, optimizer not
    ("save-staged:8", 4),         # checkpoint 8 fully staged but not published
    ("save-published:8", 8),      # published, rotation not yet run
    ("step:10", 8),               # killed mid-training after resuming
]


def _train(recipe: Path, run_dir: Path, cache: Path, fault: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RECIPEFORGE_FAULT", None)
    if fault:
        env["RECIPEFORGE_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run_dir}",
                           f"data.cache_dir={cache}"], env=env, capture_output=True, text=True, timeout=300)


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


@pytest.mark.slow
def test_killed_runs_resume_to_the_same_weights(tmp_path):
    import torch

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    cache = tmp_path / "cache"

    reference = tmp_path / "uninterrupted"
    done = _train(recipe, reference, cache, None)
    assert done.returncode == 0, done.stderr[-3000:]

    crashed = tmp_path / "crashed"
    for fault, expected in CRASHES:
        proc = _train(recipe, crashed, cache, fault)
        assert proc.returncode == -signal.SIGKILL, (fault, proc.returncode, proc.stderr[-3000:])
        newest = newest_complete(crashed / "checkpoints")
        assert (step_of(newest) if newest else None) == expected, fault
        assert not (crashed / "final").exists()
    proc = _train(recipe, crashed, cache, None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr + proc.stdout

    want, got = _weights(reference), _weights(crashed)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    # rotation kept at most two complete checkpoints, and no staging leftovers
    assert len(list((crashed / "checkpoints").glob("checkpoint-*"))) <= 2
    assert not (crashed / "checkpoints" / ".staging").exists()
