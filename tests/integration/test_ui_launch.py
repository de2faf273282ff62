"""`recipeforge ui`'s launch and stop through its API (Starlette's TestClient in this process; the run is a real
`python -m recipeforge train` process): a launch from the editor trains the tiny recipe into the runs folder,
Stop sends the preemption signal (a checkpoint saved, the run shows "preempted"), and launching the same run
again resumes from that checkpoint and finishes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette.testclient")
from ui_testing import client, make_site  # noqa: E402

SFT = "tiny/sft-lora.yaml"
RUN = ["train.max_steps=40", "train.logging_steps=1", "output.save_steps=1000", "logging.progress_bar=false"]


def _state(c, name: str) -> dict:
    return next((r for r in c.get("/api/runs").json()["runs"] if r["name"] == name), {})


def _until(c, name: str, done, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        row = _state(c, name)
        if done(row) or time.monotonic() > deadline:
            return row
        time.sleep(0.3)


def test_launch_stop_preempts_and_a_second_launch_resumes(tmp_path, monkeypatch):
    site = make_site(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    monkeypatch.setenv("RECIPEFORGE_CACHE", str(tmp_path / "cache"))
    c = client(site)
    run = site["runs"].resolve() / "launched"
    try:
        started = c.post("/api/launch", json={"path": SFT, "name": "launched", "overrides": RUN}).json()
        assert started["run_dir"] == str(run) and started["argv"][-1] == f"output.dir={run}", started
        assert _state(c, "launched")["state"] == "running"  # listed at once, before it writes its directory
        row = _until(c, "launched", lambda r: (r.get("last_step") or 0) >= 1)
        assert row["state"] == "running", row
        stopped = c.post("/api/stop", json={"name": "launched"}).json()
        assert stopped["stopped"] and stopped["signal"] == "SIGTERM"
        row = _until(c, "launched", lambda r: r.get("state") != "running")
        assert row["state"] == "preempted" and row["resumable"], row
        checkpoints = sorted((run / "checkpoints").glob("checkpoint-*"))
        assert checkpoints and not (run / "final").exists()
        saved_at = int(checkpoints[-1].name.rsplit("-", 1)[1])
        assert saved_at < 40
        log = c.get("/api/log", params={"name": "launched"}).json()["text"]
        assert "to continue, run the same command again" in log
        # Launching the same run again resumes from the checkpoint and finishes.
        again = c.post("/api/launch", json={"path": SFT, "name": "launched", "overrides": RUN}).json()
        assert again["argv"] == started["argv"]
        row = _until(c, "launched", lambda r: r.get("state") not in ("running", "preempted"))
        assert row["state"] == "finished" and row["last_step"] == 40, row
        steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line).get("split") == "train"]
        assert saved_at + 1 in steps and steps[-1] == 40
        assert f"checkpoint-{saved_at}" in (run.parent / "launched.train.log").read_text()
    finally:
        holder = run / ".recipeforge.lock"
        if holder.is_file():
            try:
                os.kill(int(json.loads(holder.read_text())["pid"]), signal.SIGTERM)
            except (ValueError, KeyError, ProcessLookupError):
                pass
