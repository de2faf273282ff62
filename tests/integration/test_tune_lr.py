"""`recipeforge tune lr` as a user types it, on the tiny pretrain recipe: it prints a suggested rate and the
override to use, writes lr_range.json and lr_range.png and no model; then the suggested rate, trained for a few
steps on a constant schedule, ends with a lower loss than 10x and 0.1x of it.

The comparison uses the tiny pretrain recipe (loss from ~6.9, random init, same seed for every run) over 30
steps and compares the final evaluation loss (the held-out split, less noisy than one logged training loss).
Measured on this recipe: the suggestion 2.0e-02 reached eval loss 1.22, 2.0e-03 reached 2.37 and 2.0e-01 2.81.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "yaml" / "tiny" / "pretrain.yaml"
STEPS = 30


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=580)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def final_eval_loss(run_dir: Path) -> float:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [r["eval_loss"] for r in records if r.get("eval_loss") is not None]
    assert losses, f"no eval loss in {run_dir}"
    return float(losses[-1])


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_tune_lr_suggests_a_rate_that_trains_best(tiny, tmp_path):
    proc = cli(tmp_path, "tune", "lr", str(RECIPE), f"output.dir={tmp_path / 'run'}", "logging.progress_bar=false")
    print(proc.stdout)
    found = re.search(r"^to use it: train\.learning_rate=(\S+)$", proc.stdout, re.M)
    assert found, proc.stdout
    rate = float(found.group(1))
    assert "suggested learning rate:" in proc.stdout and "steep" in proc.stdout
    test_dir = tmp_path / "run-lr-range"
    assert f"curve: {test_dir / 'lr_range.png'}" in proc.stdout
    assert (test_dir / "lr_range.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((test_dir / "lr_range.json").read_text())
    assert data["rule"] == "steep" and data["suggestion"] == pytest.approx(rate, rel=1e-2)
    assert len(data["lrs"]) == len(data["losses"]) == len(data["smoothed"]) >= 10
    assert data["lrs"][0] == pytest.approx(1e-7) and data["lrs"] == sorted(data["lrs"])
    assert not (test_dir / "final").exists()  # the test's weights are not kept
    assert not any((test_dir / "checkpoints").glob("checkpoint-*"))
    # metrics.jsonl holds the rate each step ran at, not the recipe's constant one
    train = [json.loads(line) for line in (test_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["learning_rate"] for r in train if r.get("split") == "train" and "learning_rate" in r]
    assert logged[:3] == pytest.approx(data["lrs"][:3])

    finals = {}
    for name, lr in (("suggested", rate), ("10x", rate * 10), ("0.1x", rate / 10)):
        # trained in this process: what counts is the rate's final loss, not the command line
        run_dir = tiny.train(str(RECIPE), tmp_path / f"train-{name}", f"train.learning_rate={lr:.3e}",
                             "train.scheduler=constant", "train.warmup_steps=0", f"train.max_steps={STEPS}",
                             f"output.save_steps={STEPS}", f"train.eval_steps={STEPS}")
        finals[name] = final_eval_loss(run_dir)
    print("final eval loss after", STEPS, "steps:", {k: round(v, 4) for k, v in finals.items()}, "at", rate)
    assert finals["suggested"] < finals["10x"] and finals["suggested"] < finals["0.1x"], finals
