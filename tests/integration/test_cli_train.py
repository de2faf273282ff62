"""`python -m recipeforge train` in a fresh process: trains offline, touches no network, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Runs `python -m recipeforge ...` with an audit hook that records every attempt to resolve or
# connect to a non-local address, and prints them at exit.
WRAPPER = r"""
import atexit, runpy, sys
attempts = []
def hook(event, args):
    if event == "socket.getaddrinfo" and args[0] not in (None, "localhost", "127.0.0.1", "::1"):
        attempts.append(str(args[0]))
    elif event == "socket.connect" and isinstance(args[1], tuple) and args[1][0] not in ("127.0.0.1", "::1"):
        attempts.append(str(args[1]))
sys.addaudithook(hook)
atexit.register(lambda: print("NETWORK_ATTEMPTS=" + repr(attempts), file=sys.stderr))
sys.argv = ["recipeforge", *sys.argv[1:]]
runpy.run_module("recipeforge", run_name="__main__", alter_sys=True)
"""


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env["RECIPEFORGE_CACHE"] = str(tmp_path / "cache")
    return subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_train_runs_offline_from_a_fresh_process(tmp_path):
    recipe = REPO / "examples" / "yaml" / "tiny" / "pretrain.yaml"
    proc = _run(["train", str(recipe), "train.max_steps=6", "output.save_steps=3", "logging.tensorboard=true"],
                tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "pretrain"  # default output.dir: runs/<recipe file stem>
    assert (run / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-3", "checkpoint-6"]
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("split") == "train" and "loss" in r for r in records)
    # Nothing was looked up on the network, although HF_HUB_OFFLINE was not set by the caller.
    assert "NETWORK_ATTEMPTS=[]" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_cli_user_error_exits_2_without_traceback(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage: pretrain\nmodel: {name_or_path: 'tiny:llama'}\nhardware: {gpus_per_node: 0}\n"
                      "data:\n  datasets: [{path: nowhere.jsonl, format: text}]\ntrain: {max_steps: 1}\n")
    proc = _run(["train", str(recipe)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "r.yaml:5" in proc.stderr and "nowhere.jsonl" in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr
