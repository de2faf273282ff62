"""Preemption loses no work: SIGTERM or SIGUSR1 during `train` has every process finish its step, save a
checkpoint through the crash-safe path, say so, and exit with 75; the same command then resumes from it
and the loss goes on from where it stopped. One process and two gloo processes (the signal goes to the
`recipeforge train` command only, which passes it to its workers). Also: Ctrl-C semantics and the
signal forwarding of the sbatch script `recipeforge launch --slurm` writes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipeforge.outputs.checkpoint import is_complete, verify_checkpoint
from recipeforge.stages import preemption

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "examples" / "data" / "sft-alpaca.jsonl"
EXIT_PREEMPTED = 75

# Many steps: the run is always still training when the signal comes.
RECIPE = f"""\
stage: sft
model: {{name_or_path: "tiny:llama"}}
hardware: {{gpus_per_node: 0}}
data:
  datasets: [{{path: "{DATA}", format: alpaca}}]
  sequence_len: 128
  packing: true
train:
  max_steps: 2000
  global_batch_size: 4
  micro_batch_size: 2
  learning_rate: 3.0e-3
  logging_steps: 1
logging: {{progress_bar: false}}
output:
  save_steps: 5000
"""


def _losses(run: Path) -> dict[int, float]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return {}
    out = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if rec.get("split") == "train" and "loss" in rec:
            out[rec["step"]] = rec["loss"]
    return out


def _start(recipe: Path, run: Path, cache: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RECIPEFORGE_FAULT", None)
    return subprocess.Popen([sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run}",
                             f"data.cache_dir={cache}", *flags], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stop_after(proc: subprocess.Popen, run: Path, past_step: int, sig: int) -> tuple[int, str]:
    """Wait until a loss beyond `past_step` is logged, send `sig` to `proc`, return (exit code, stderr)."""
    deadline = time.monotonic() + 240
    while not any(step > past_step for step in _losses(run)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no step past {past_step} logged: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the run did not stop within 120 s of the signal") from None
    return proc.returncode, err


def _check_stopped(code: int, err: str, run: Path, signame: str) -> int:
    """The run stopped as documented; returns the step of the checkpoint it saved."""
    assert code == EXIT_PREEMPTED, err[-3000:]
    ckpts = [p for p in (run / "checkpoints").glob("checkpoint-*") if is_complete(p)]
    newest = max(ckpts, key=lambda p: int(p.name.split("-")[1]))
    step = int(newest.name.split("-")[1])
    assert f"stopped by {signame}; checkpoint saved at step {step}: {newest}" in err, err[-3000:]
    assert "run the same command again" in err and "Traceback" not in err
    assert verify_checkpoint(newest) == []
    assert max(_losses(run)) == step  # the stop step is logged, nothing beyond it
    assert not (run / "final").exists() and not (run / ".recipeforge.lock").exists()
    return step


def _preempt_and_resume(tmp_path: Path, *flags: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    run, cache = tmp_path / "run", tmp_path / "cache"

    code, err = _stop_after(_start(recipe, run, cache, *flags), run, 10, signal.SIGTERM)
    stopped = _check_stopped(code, err, run, "SIGTERM")
    before = _losses(run)

    # The same command resumes from that checkpoint; stop it again, with Slurm's warning signal.
    proc = _start(recipe, run, cache, *flags)
    code, err = _stop_after(proc, run, stopped + 1, signal.SIGUSR1)
    assert f"resuming from {run / 'checkpoints' / f'checkpoint-{stopped}'}" in err, err[-3000:]
    again = _check_stopped(code, err, run, "SIGUSR1")
    assert again > stopped
    after = _losses(run)
    assert sorted(after) == list(range(1, again + 1))  # every step once: none repeated, none skipped
    assert {s: after[s] for s in before} == before
    # the loss goes on from where it stopped, far from where it started
    first, last, resumed = before[1], before[stopped], after[stopped + 1]
    assert first - last > 0.5 and resumed < (first + last) / 2, (first, last, resumed)


@pytest.mark.slow
def test_sigterm_saves_and_the_same_command_resumes(tmp_path):
    _preempt_and_resume(tmp_path, "train.micro_batch_size=4")


@pytest.mark.slow
def test_two_processes_stop_together_and_resume(tmp_path):
    import psutil

    _preempt_and_resume(tmp_path, "--nproc-per-node", "2")
    # no worker outlived the command that launched it
    time.sleep(1)
    left = [p for p in psutil.process_iter(["cmdline"])
            if any(str(tmp_path) in part for part in (p.info["cmdline"] or []))]
    assert not left, [p.info["cmdline"] for p in left]


def test_ctrl_c_first_stops_gracefully_then_aborts():
    preemption.install()
    try:
        assert preemption.requested() == 0 and preemption.agreed_stop() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert preemption.requested() == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)  # repeated stop signals change nothing
        time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt):  # after a stop request, Ctrl-C aborts
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    finally:
        preemption.uninstall()
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)
    preemption.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)  # a first Ctrl-C is a stop request, not an exception
        time.sleep(0.05)
        assert preemption.requested() == signal.SIGINT
    finally:
        preemption.uninstall()


def test_sbatch_script_passes_the_warning_signal_on_and_requeues(tmp_path):
    """The generated script's own logic, run by bash; `srun` and `scontrol` are stand-ins that record
    what they are asked (no Slurm on this machine): the stand-in task exits 75 on USR1 as train does."""
    from recipeforge.backends.slurm import sbatch_script

    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(job_name="j", nodes=1, gpus_per_node=0, recipe="/r.yaml", overrides=[],
                                    run_dir=tmp_path))
    text = script.read_text()
    assert "#SBATCH --signal=B:USR1@120\n" in text and "#SBATCH --requeue\n" in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    (bin_dir / "srun").write_text('#!/bin/bash\necho "srun $*" >> "$LOG"\n'
                                  "trap 'echo task got USR1 >> \"$LOG\"; exit 75' USR1\n"
                                  "while :; do sleep 0.05; done\n")
    (bin_dir / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && echo node0 || echo "scontrol $*" >> "$LOG"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "node0"}
    job = subprocess.Popen(["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (log.exists() and "srun" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    _, err = job.communicate(timeout=20)
    assert job.returncode == EXIT_PREEMPTED, err
    assert log.read_text().splitlines() == ["srun --kill-on-bad-exit=1 recipeforge train /r.yaml",
                                            "task got USR1", "scontrol requeue 42"]
