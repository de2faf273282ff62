"""Experiment trackers write into the run directory and need no network (wandb offline, an MLflow
file store): the run's config is the resolved recipe, every logged loss reaches the tracker with its
step, and a two-process run with wandb ends cleanly (the tracker run is finished inside training,
before the process group goes away)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
needs_wandb = pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb (the `wandb` extra)")


def test_tensorboard_events_in_the_run_dir(tiny, tmp_path):
    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=3", "logging.tensorboard=true")
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


# -- reading an offline W&B run (the .wandb file is a LevelDB-style log of protobuf records) -----------

def _wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        else:
            pending += chunk


def _offline_run(run_dir: Path) -> dict:
    files = list((run_dir / "wandb").rglob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    config, losses, kinds = {}, {}, []
    for r in _wandb_records(files[0]):
        kind = r.WhichOneof("record_type")
        kinds.append(kind)
        for item in (r.run.config.update if kind == "run" else r.config.update if kind == "config" else ()):
            config[item.key] = json.loads(item.value_json)
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            if "loss" in row:
                losses[row["_step"]] = row["loss"]
    return {"config": config, "losses": losses, "kinds": kinds}


def _assert_wandb_run_matches(tiny, run: Path) -> None:
    logged = _offline_run(run)
    assert logged["kinds"][-1] == "exit"  # finished, not abandoned
    assert logged["config"]["train"]["max_steps"] == 4 and logged["config"]["stage"] == "pretrain"
    steps = [r["step"] for r in tiny.records(run, "train") if "loss" in r]
    assert logged["losses"] == pytest.approx(dict(zip(steps, tiny.values(run, "loss"))))
    assert logged["losses"][4] < logged["losses"][1] - 0.2  # and the model learned


@needs_wandb
def test_wandb_offline_keeps_everything_in_the_run_dir(tiny, tmp_path):
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != "WANDB_SERVICE"}
    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=4", "train.logging_steps=1",
                     "logging.wandb.project=tiny", "logging.wandb.mode=offline")
    _assert_wandb_run_matches(tiny, run)
    after = {k: v for k, v in os.environ.items() if k.startswith("WANDB_") and k != "WANDB_SERVICE"}
    assert after == before  # the tracker's settings do not leak into later runs


@needs_wandb
def test_wandb_on_two_processes_ends_cleanly(tiny, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(REPO / "examples/yaml/tiny/pretrain.yaml"),
           f"output.dir={run}", f"data.cache_dir={tiny.cache_dir}", "train.max_steps=4", "train.logging_steps=1",
           "train.micro_batch_size=auto", "data.val_size=0", "logging.wandb.project=tiny",
           "logging.wandb.mode=offline", "--nproc-per-node", "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "terminate called" not in proc.stderr
    # The W&B run was finished by the main rank during training, before the job ended.
    assert proc.stderr.index("wandb sync") < proc.stderr.index("[recipeforge] done:")
    _assert_wandb_run_matches(tiny, run)
    assert len(list((run / "wandb").rglob("offline-run-*"))) == 1  # one tracker run: rank 1 started none


@pytest.mark.requires_mlflow
def test_mlflow_file_store_gets_the_recipe_metrics_and_run_files(tiny, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    store = tmp_path / "mlruns"
    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=4", "train.logging_steps=1",
                     f"logging.mlflow.tracking_uri=file:{store}", "logging.mlflow.experiment=tiny-exp")
    assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ  # set for the run only
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to read the file store
    client = MlflowClient(tracking_uri=f"file:{store}")
    experiment = client.get_experiment_by_name("tiny-exp")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"
    params = found.data.params
    assert params["stage"] == "pretrain" and float(params["train.learning_rate"]) == 3e-3
    assert params["train.max_steps"] == "4" and params["output.dir"] == str(run)
    assert params["data.datasets.0.format"] == "text"
    history = {m.step: m.value for m in client.get_metric_history(found.info.run_id, "loss")}
    steps = [r["step"] for r in tiny.records(run, "train") if "loss" in r]
    assert history == pytest.approx(dict(zip(steps, tiny.values(run, "loss"))))
    assert history[4] < history[1] - 0.2
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"plan.json", "resolved_recipe.yaml"} <= artifacts
    local = Path(client.download_artifacts(found.info.run_id, "plan.json", str(tmp_path)))
    assert json.loads(local.read_text()) == json.loads((run / "plan.json").read_text())


def _resume_after_a_kill(tiny, run: Path, *overrides: str, force: bool = False) -> None:
    """What a run killed after its step-3 checkpoint leaves (no step-6 checkpoint, no final/), resumed."""
    import shutil

    from recipeforge.run import train

    shutil.rmtree(run / "checkpoints" / "checkpoint-6")
    shutil.rmtree(run / "final")
    train(tiny.load("pretrain", run, *overrides), force=force)


@pytest.mark.requires_mlflow
def test_a_resumed_run_continues_its_mlflow_run_and_says_what_changed(tiny, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    store = tmp_path / "mlruns"
    args = ("train.max_steps=6", "train.logging_steps=1", "output.save_steps=3", f"logging.mlflow.tracking_uri=file:{store}",
            "logging.mlflow.experiment=resumed")
    run = tiny.train("pretrain", tmp_path / "run", *args)
    _resume_after_a_kill(tiny, run, *args, "train.learning_rate=0.002", force=True)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{store}")
    (found,) = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])  # one run
    assert found.info.status == "FINISHED"
    tags = found.data.tags
    assert tags["recipeforge.resumed_at_step"] == "3"
    assert tags["recipeforge.changed.train.learning_rate"] == "0.003 -> 0.002"
    assert found.data.params["train.learning_rate"] == "0.003"  # as it started; the tag says what changed
    history = client.get_metric_history(found.info.run_id, "loss")
    assert sorted({m.step for m in history}) == [1, 2, 3, 4, 5, 6]  # the step axis goes on
    assert json.loads((run / "trackers.json").read_text())["mlflow"]["id"] == found.info.run_id


@needs_wandb
def test_a_resumed_run_continues_its_wandb_run(tiny, tmp_path):
    args = ("train.max_steps=6", "train.logging_steps=1", "output.save_steps=3", "logging.wandb.project=tiny",
            "logging.wandb.mode=offline")
    run = tiny.train("pretrain", tmp_path / "run", *args)
    first_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    _resume_after_a_kill(tiny, run, *args)
    runs = sorted((run / "wandb").rglob("offline-run-*"))
    # one W&B run, resumed (two starts in the same second get a "-1" suffix on the folder)
    assert len(runs) == 2 and all(re.search(rf"-{re.escape(first_id)}(-\d+)?$", r.name) for r in runs)
    later = [f for f in runs[1].glob("run-*.wandb")]
    losses = {}
    for r in _wandb_records(later[0]):
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            if "loss" in row:
                losses[row["_step"]] = row["loss"]
    assert sorted(losses) == [4, 5, 6]  # the resumed part logs from the checkpoint's step on
