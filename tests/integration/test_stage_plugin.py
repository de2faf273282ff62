"""A stage added by a plugin trains the tiny model from the command line, as a user types it: the
test-only distribution under tests/fixtures/stage_plugin publishes `smooth_lm` (causal-LM training
with a label-smoothed loss) in the entry-point group ``recipeforge.stages``, and the child process
finds it on its PYTHONPATH, as it would find a pip-installed plugin. Nothing under recipeforge/ names
the stage. Its run directory and summary are a built-in stage's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_testing import STAGE_PLUGIN

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_lm import FINAL_FULL, OPTIONAL, RUN_FILES  # noqa: E402  # a built-in LM stage's run files

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path, plugin: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECIPEFORGE_CACHE": str(cwd / "cache"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    paths = [str(STAGE_PLUGIN)] if plugin else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_plugin_stage_trains_the_tiny_model_from_the_command_line(tmp_path):
    recipe = tmp_path / "smooth.yaml"
    recipe.write_text(f"extends: {REPO / 'examples' / 'yaml' / 'tiny' / 'pretrain.yaml'}\n"
                      "stage: smooth_lm\nsmooth_lm: {label_smoothing: 0.2}\n")
    proc = _cli("train", str(recipe), "train.max_steps=30", "train.eval_steps=15", "output.save_steps=30",
                "logging.progress_bar=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    run = tmp_path / "runs" / "smooth"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("split") == "train" and "loss" in r]
    loss = [r["loss"] for r in train]
    assert len(loss) >= 5 and loss[0] > 6.5  # random init: about ln(1024)
    assert loss[-1] < loss[0] - 2.0, loss  # the model learned
    evals = [r["eval_loss"] for r in records if r.get("split") == "eval" and "eval_loss" in r]
    assert len(evals) >= 2 and evals[-1] < evals[0]
    # The runner read its section: the smoothing it trained with is what the recipe set.
    assert {r.get("smooth_lm/label_smoothing") for r in train} == {0.2}

    # The run directory and the summary are a built-in stage's.
    assert {p.name for p in run.iterdir() if p.is_file()} == RUN_FILES
    assert {p.name for p in run.iterdir()} - OPTIONAL == RUN_FILES | {"checkpoints", "final", "phase_memory"}
    assert {p.name for p in (run / "final").iterdir()} == FINAL_FULL
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["checkpoint-30"]
    summary = re.search(r"run written to (\S+) \(loss ([\d.]+) -> ([\d.]+), eval_loss ([\d.]+) -> ([\d.]+)\)",
                        proc.stdout + proc.stderr)
    assert summary is not None, (proc.stdout + proc.stderr)[-2000:]
    assert Path(summary[1]).resolve() == run.resolve()
    assert float(summary[2]) == pytest.approx(loss[0], abs=1e-2) and float(summary[3]) == pytest.approx(loss[-1], abs=1e-2)
    card = (run / "README.md").read_text()
    assert "trained with a label-smoothed LM loss" in card and "stage: smooth_lm" in card
    plan = json.loads((run / "plan.json").read_text())
    assert plan["backend"] == "single" and plan["device"] == "cpu"


def test_without_the_plugin_the_stage_is_a_short_user_error(tmp_path):
    recipe = tmp_path / "smooth.yaml"
    recipe.write_text(f"extends: {REPO / 'examples' / 'yaml' / 'tiny' / 'pretrain.yaml'}\n"
                      "stage: smooth_lm\n")
    proc = _cli("validate", str(recipe), cwd=tmp_path, plugin=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "smooth.yaml:2:1 stage: must be one of pretrain, sft," in proc.stderr and \
        "(got 'smooth_lm')" in proc.stderr, proc.stderr
