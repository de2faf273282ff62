"""A diverging run is noticed: a NaN/inf loss stops it at once (exit 2, the step and value named, the
last good checkpoint kept, nothing diverged saved), and a sustained loss spike is warned about.

The NaNs are real: fp16 weights under Adam on a CPU (its epsilon rounds to zero in fp16, so the first
update divides 0 by 0), or a weight matrix filled with NaN after a step (`RECIPEFORGE_FAULT=nan:<step>`)
so that the next step's loss is NaN the way a blown-up update makes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.cli import main
from recipeforge.stages.divergence import Diverged, SpikeWatch, make_callback

SFT = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny" / "sft-full.yaml"
pytestmark = pytest.mark.slow


def _args(tmp_path, *extra: str) -> list[str]:
    return ["train", str(SFT), f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
            "logging.progress_bar=false", "data.val_size=0", "train.logging_steps=1", "train.max_steps=6",
            "output.save_steps=2", *extra]


def _error(err: str) -> str:
    assert "Traceback" not in err and "internal error" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0]


def _finite_weights(path: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(str(path)).values())


def test_real_nan_from_fp16_adam_stops_at_once(tmp_path, capsys):
    assert main(_args(tmp_path, "model.dtype=fp16", "output.save_steps=3")) == 2
    err = capsys.readouterr().err
    line = _error(err)
    assert "train.learning_rate: training diverged: loss is nan at step 2" in line, line
    assert "no checkpoint had been saved yet" in line
    assert "hint: lower train.learning_rate" in err
    run = tmp_path / "run"
    assert not (run / "final").exists() and not any((run / "checkpoints").glob("checkpoint-*"))


def test_nan_after_a_checkpoint_keeps_it_and_writes_no_final(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *_args(tmp_path)], capture_output=True, text=True,
                          env={**__import__("os").environ, "RECIPEFORGE_FAULT": "nan:2"})
    assert proc.returncode == 2, proc.stderr
    line = _error(proc.stderr)
    assert "training diverged: loss is nan at step 3; stopped without saving the diverged weights; the last " \
           "complete checkpoint is kept (checkpoints/checkpoint-2): change the recipe and rerun with --force" in line
    run = tmp_path / "run"
    kept = run / "checkpoints" / "checkpoint-2"
    assert (kept / "checkpoint_complete.json").is_file() and _finite_weights(kept / "model.safetensors")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert not (run / "final").exists() and not (run / "README.md").exists()
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("split") == "train"] == [1, 2, 3]
    assert steps[-1]["loss"] is None  # the NaN step is on record (as null)


def test_nan_between_logs_is_not_checkpointed(tmp_path, capsys, monkeypatch):
    """Logged every 10 steps, the NaN of step 3 shows first when step 4 is about to be saved."""
    monkeypatch.setenv("RECIPEFORGE_FAULT", "nan:2")
    assert main(_args(tmp_path, "train.logging_steps=10")) == 2
    line = _error(capsys.readouterr().err)
    assert "the weights hold NaN or infinite values at step 4, so checkpoint-4 was not written" in line
    assert "the last complete checkpoint is kept (checkpoints/checkpoint-2)" in line
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2"]
    assert not (run / "final").exists()


def test_the_check_can_be_turned_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RECIPEFORGE_FAULT", "nan:2")
    assert main(_args(tmp_path, "train.divergence.stop_on_nan=false")) == 0
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_a_sustained_loss_spike_is_warned_about_or_stops(tmp_path, capsys):
    """Learning rate 0.99: the loss jumps from 7 to 30-60 and stays there."""
    spike = ("train.learning_rate=0.99", "train.logging_steps=2", "train.max_steps=10", "output.save_steps=4")
    assert main(_args(tmp_path, *spike)) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "has stayed above 3 x the running median" in line]
    assert len(warnings) == 1 and warnings[0].startswith("[recipeforge] warning: loss "), err
    assert " at step 8 " in warnings[0] and "for 3 logs" in warnings[0]

    assert main(_args(tmp_path / "b", *spike, "train.divergence.on_spike=stop")) == 2
    line = _error(capsys.readouterr().err)
    assert "train.divergence.on_spike: training diverged: loss " in line and " at step 8 " in line
    assert "the last complete checkpoint is kept (checkpoints/checkpoint-4)" in line
    assert not (tmp_path / "b" / "run" / "final").exists()


# -- the rule itself ---------------------------------------------------------------------------------

def _feed(watch: SpikeWatch, values) -> list[int]:
    return [i for i, v in enumerate(values) if watch.add(v) is not None]


def test_spike_rule():
    assert _feed(SpikeWatch(3.0, 10, 3), [7, 6, 5, 4, 3, 2.5, 2, 2.2, 1.9]) == []          # healthy
    assert _feed(SpikeWatch(3.0, 10, 3), [7, 7, 33, 61, 38, 27, 20]) == [4]                 # sustained, once
    assert _feed(SpikeWatch(3.0, 10, 3), [2, 2, 9, 2, 9, 2, 9, 2]) == []                     # isolated spikes
    assert _feed(SpikeWatch(3.0, 4, 2), [1, 1, 1, 1, 5, 5, 5, 5, 5]) == [5]                  # spikes never
    assert _feed(SpikeWatch(None, 4, 1), [1, 100, 100]) == []                                 # become baseline
    assert _feed(SpikeWatch(3.0, 4, 1), [0.01, -0.02, 0.5, 0.6]) == []                       # signed losses


def _state(step: int):
    return SimpleNamespace(global_step=step, is_world_process_zero=True)


def test_grpo_losses_are_not_judged_by_ratio_but_nan_still_stops(tmp_path):
    from recipeforge.config.schema.train import DivergenceConfig

    said = []
    config = DivergenceConfig(spike_patience=1)
    grpo = make_callback(config, stage="grpo", checkpoints=tmp_path, log=said.append)
    control = SimpleNamespace(should_save=False)
    for step, loss in enumerate([0.001, 0.001, 0.5, 0.9], start=1):
        grpo.on_log(None, _state(step), control, logs={"loss": loss, "grad_norm": 0.1})
    assert said == []
    with pytest.raises(Diverged, match="grad_norm is inf at step 5"):
        grpo.on_log(None, _state(5), control, logs={"loss": 0.1, "grad_norm": float("inf")})
    dpo = make_callback(config, stage="dpo", checkpoints=tmp_path, log=said.append)
    for step, loss in enumerate([0.69, 0.6, 2.5], start=1):
        dpo.on_log(None, _state(step), control, logs={"loss": loss})
    assert len(said) == 1 and "loss 2.5 at step 3" in said[0]
    dpo.on_log(None, _state(4), control, logs={"eval_loss": float("nan")})  # evaluation is not training
