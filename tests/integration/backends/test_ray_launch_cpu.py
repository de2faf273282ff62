"""`recipeforge launch --ray` on a local Ray cluster (CPU only, two workers over gloo), against the torchrun
(accelerate) launch of the same recipe.

The cluster is started by the module (`ray start --head --block` on a free port, 4 CPUs) and stopped by
its process id at the end. Skipped where Ray Train is not installed; `.ci/ray` installs it into a virtual
environment of its own and runs this file.

- Rank 1 SIGKILLed after step 5 (`RECIPEFORGE_FAULT=kill:1:5`, first attempt only; checkpoints every 3
  steps), `distributed.max_restarts=1` (Ray's `FailureConfig(max_failures=1)`): Ray starts the worker group
  again, which resumes from checkpoint-3, runs steps 4 and 5 again and finishes, exit 0, final/ written, every
  step's loss the torchrun launch's (one run for both checks: the CI step has minutes, not more).
- SIGTERM to the launching command: the workers save and stop, and Ray does not restart them: exit 75.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install 'recipeforge[ray]'; .ci/ray)")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
MAX_STEPS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RECIPEFORGE_FAULT", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **extra}


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head on this machine with 4 CPUs; its address. Its workers import this checkout."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rf-ray-")  # short: Ray's socket paths live under it
    ray_bin = Path(sys.executable).parent / "ray"
    cmd = [str(ray_bin) if ray_bin.is_file() else "ray", "start", "--head", "--block", "--num-cpus", "4",
           "--port", str(port), "--temp-dir", temp, "--disable-usage-stats", "--include-dashboard=false"]
    head = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        probe = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='{address}'); ray.shutdown()"],
                               env=_env(), capture_output=True, text=True)
        if probe.returncode == 0:
            break
        assert head.poll() is None and time.monotonic() < deadline, f"the Ray head did not start:\n{probe.stderr[-3000:]}"
        time.sleep(1)
    yield address
    # The head's session (`ray start`, the GCS, the raylet, which takes its workers with it): SIGTERM, as
    # `ray stop` sends, then SIGKILL for whatever is left.
    os.killpg(head.pid, signal.SIGTERM)
    try:
        head.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray-cache")


def _args(run: Path, cache: Path, *overrides: str) -> list[str]:
    return [str(SFT), f"output.dir={run}", f"data.cache_dir={cache}", f"train.max_steps={MAX_STEPS}",
            "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=3", "data.val_size=0",
            "logging.progress_bar=false", "distributed.backend=ddp", "--nproc-per-node", "2", *overrides]


def _ray_launch(run: Path, cache: Path, address: str, *overrides: str, env: dict | None = None):
    cmd = [sys.executable, "-m", "recipeforge", "launch", "--ray", *_args(run, cache, *overrides), "--ray-address", address]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=run.parent, timeout=400, env=_env(**(env or {})))


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("split") == "train" and "loss" in r]
    assert [r["step"] for r in train] == list(range(1, MAX_STEPS + 1))  # every step once (a restart's cut)
    return {r["step"]: r["loss"] for r in train}


def _output(proc: subprocess.CompletedProcess) -> str:
    return f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-8000:]}"


@pytest.fixture(scope="module")
def torchrun_losses(tmp_path_factory, cache) -> dict[int, float]:
    """The same recipe launched the usual way (accelerate launch, torch's elastic agent) on this machine."""
    run = tmp_path_factory.mktemp("torchrun") / "run"
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "train", *_args(run, cache)], capture_output=True,
                          text=True, cwd=run.parent, timeout=400, env=_env())
    assert proc.returncode == 0, _output(proc)
    return _losses(run)


def _assert_finished(proc: subprocess.CompletedProcess, run: Path, torchrun_losses: dict[int, float]) -> None:
    assert proc.returncode == 0, _output(proc)
    assert "Ray Train TorchTrainer on 127.0.0.1:" in proc.stderr and "2 workers (1 CPU each, gloo)" in proc.stderr
    assert "Started training worker group of size 2" in proc.stdout + proc.stderr
    losses = _losses(run)
    assert losses == pytest.approx(torchrun_losses, rel=1e-4, abs=1e-4)
    assert (run / "final" / "model.safetensors").is_file()
    assert json.loads((run / "outcome.json").read_text())["kind"] == "finished"
    observed = json.loads((run / "backend.json").read_text())["observed"]
    assert observed["num_processes"] == 2 and observed["process_group_backend"] == "gloo"
    assert not (run / ".recipeforge.lock").exists()


def test_a_killed_worker_is_restarted_by_ray_and_resumes_from_the_checkpoint(tmp_path, cache, ray_cluster,
                                                                           torchrun_losses):
    """The Ray launch trains to the torchrun launch's losses, step for step: steps 1-3 of the first
    attempt, 4-8 of the restarted one (the first attempt's 4-5 cut from metrics.jsonl)."""
    run = tmp_path / "run"
    proc = _ray_launch(run, cache, ray_cluster, "distributed.max_restarts=1", env={"RECIPEFORGE_FAULT": "kill:1:5"})
    _assert_finished(proc, run, torchrun_losses)  # steps 4-5 of the failed attempt cut, then run again
    output = proc.stdout + proc.stderr
    assert "max_failures=1" in output
    assert "The actor is dead because its worker process has died" in output  # rank 1 really died
    assert (f"restart 1 of the worker group after a worker failed: resuming from "
            f"{run / 'checkpoints' / 'checkpoint-3'}; steps 4-5 run again") in output
    assert sorted(p.name for p in (run / "ray_attempts").iterdir()) == ["attempt-0", "attempt-1"]
    job = json.loads((run / "ray_job.json").read_text())
    assert job["num_workers"] == 2 and job["resources_per_worker"] == {"CPU": 1.0} and job["max_failures"] == 1
    logged = [line.split("{'loss': ")[1].split(",")[0] for line in output.splitlines() if "{'loss': " in line]
    assert len(set(logged)) == MAX_STEPS  # the repeated steps 4 and 5 logged the same losses again


def test_sigterm_saves_and_exits_75_without_a_restart(tmp_path, cache, ray_cluster):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipeforge", "launch", "--ray",
           *_args(run, cache, "distributed.max_restarts=1", "output.save_steps=5000", "train.max_steps=3000"),
           "--ray-address", ray_cluster]
    cmd.remove(f"train.max_steps={MAX_STEPS}")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").is_file() or '"loss"' not in (run / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, err[-6000:]
    assert "SIGTERM: asking the Ray workers to save a checkpoint and stop" in err
    assert "stopped by SIGTERM; checkpoint saved at step" in err
    assert "recipeforge launch --ray" in err  # how to continue
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["kind"] == "preempted" and outcome["preempted"]["signal"] == "SIGTERM"
    step = outcome["preempted"]["step"]
    assert (run / "checkpoints" / f"checkpoint-{step}").is_dir() and not (run / "final").exists()
    assert sorted(p.name for p in (run / "ray_attempts").iterdir()) == ["attempt-0"]  # a stop is no failure


def test_a_cluster_that_does_not_answer_is_a_short_error(tmp_path, cache):
    run = tmp_path / "run"
    started = time.monotonic()
    proc = _ray_launch(run, cache, f"127.0.0.1:{_free_port()}")
    assert proc.returncode == 2, _output(proc)
    assert "cannot connect to the Ray cluster at 127.0.0.1:" in proc.stderr and "ray start --head" in proc.stderr
    assert time.monotonic() - started < 60 and not (run / "final").exists()
