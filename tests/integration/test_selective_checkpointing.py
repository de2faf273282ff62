"""Selective and every-N-th-layer activation checkpointing: the tiny SFT recipe trains with the loss curve
of full checkpointing (recomputation changes what is kept, not what is computed), the plan (`recipeforge
plan`) says which checkpointing runs, and a mistaken combination is refused at its line (`validate`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def _train(tiny, tmp_path: Path, name: str, *overrides: str) -> list[float]:
    """The run trained in this process (what is compared is its loss curve, not the command line)."""
    run = tiny.train(str(SFT), tmp_path / name, "train.max_steps=6", "train.logging_steps=1", "data.val_size=0",
                     *overrides)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("split") == "train" and "loss" in r]


def test_selective_and_every_nth_layer_train_like_full_checkpointing(tiny, tmp_path):
    full = _train(tiny, tmp_path, "full", "train.gradient_checkpointing=true")
    selective = _train(tiny, tmp_path, "selective", "train.gradient_checkpointing=selective")
    every = _train(tiny, tmp_path, "every2", "train.gradient_checkpointing=true", "train.checkpoint_every=2")
    assert len(full) == 6 and full[-1] < full[0] - 0.5  # it learned
    assert selective == full and every == full  # the same arithmetic, recomputed or kept
    plan = json.loads((tmp_path / "selective" / "plan.json").read_text())
    assert plan["gradient_checkpointing"] is True and plan["checkpoint_mode"] == "selective"


def test_the_plan_names_the_checkpointing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "recipeforge", "plan", str(SFT),
                          "train.gradient_checkpointing=selective"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.strip().startswith("gradient checkpointing"))
    assert "selective" in row


def test_checkpoint_every_needs_full_checkpointing(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {SFT}\ntrain:\n  gradient_checkpointing: selective\n  checkpoint_every: 2\n")
    out = subprocess.run([sys.executable, "-m", "recipeforge", "validate", str(recipe)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{recipe}:4" in out.stderr and "checkpoint_every: 2" in out.stderr
