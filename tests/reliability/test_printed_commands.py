"""Every command recipeforge prints for the user to run is run here, as printed, and does what it says.

The resume line after a SIGTERM carries every flag the resume needs (here `--trust-code`, without which
the recipe does not even load); `--overwrite` never (it would delete the checkpoint).
The eval retry printed after training carries the trust flag its task files need. `sbatch` and `kubectl
apply` lines and the first step of the GGUF route quote paths with spaces. A full disk during `export`
names the export's folder and its disk, not `None` and not the working directory's disk.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surface_testing import REPO, recipeforge, refused

pytestmark = pytest.mark.slow

DATA = REPO / "examples" / "data" / "sft-alpaca.jsonl"


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    for name in ("RECIPEFORGE_TRUST_CODE", "RECIPEFORGE_FAULT", "RECIPEFORGE_DEBUG"):
        env.pop(name, None)
    return env


def _shell(line: str, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess:
    """`line` run by bash as the user pastes it; `recipeforge` is this checkout's, `path` holds stubs."""
    bin_dir = cwd / ".bin"
    bin_dir.mkdir(exist_ok=True)
    launcher = bin_dir / "recipeforge"
    launcher.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m recipeforge \"$@\"\n")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
    env = _env()
    env["PATH"] = os.pathsep.join(str(p) for p in (path, bin_dir) if p) + os.pathsep + env["PATH"]
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _losses(run: Path) -> list[int]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    steps = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("split") == "train" and "loss" in rec:
            steps.append(rec["step"])
    return steps


def test_the_resume_line_after_sigterm_carries_every_flag_it_needs(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"stage: sft\nmodel: {{name_or_path: tiny:llama, trust_remote_code: true}}\n"
                      f"hardware: {{gpus_per_node: 0}}\ndata:\n  datasets: [{{path: {DATA}, format: alpaca}}]\n"
                      f"  sequence_len: 128\n  cache_dir: {tmp_path / 'cache'}\n"
                      "train: {max_steps: 60, global_batch_size: 4, micro_batch_size: 2, logging_steps: 1}\n"
                      "logging: {progress_bar: false}\noutput: {save_steps: 5000}\n")
    run = tmp_path / "run"
    # As typed: the global flag after the command, an override, --overwrite (the first time only).
    proc = subprocess.Popen([sys.executable, "-m", "recipeforge", "train", "r.yaml", f"output.dir={run}",
                             "--trust-code", "--overwrite"], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not any(step > 2 for step in _losses(run)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=180)[1]
    assert proc.returncode == 75, err[-3000:]
    line = re.search(r"to continue, run the same command again \(it resumes from the newest checkpoint\): (.+)", err)
    assert line, err[-3000:]
    command = line.group(1)
    assert "--trust-code" in command and "--overwrite" not in command, command
    # Without the flag the recipe is refused: the printed command is what makes the resume work.
    refused(recipeforge("train", "r.yaml", f"output.dir={run}", cwd=tmp_path), "model.trust_remote_code")
    done = _shell(command, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stderr and (run / "final" / "model.safetensors").is_file()


def test_the_eval_retry_printed_after_training_works(tmp_path):
    """The run's evaluation fails (its task config points at data not there yet); the printed retry,
    run as printed once the data is there, evaluates the run."""
    rows = tmp_path / "mc-rows.jsonl"
    (tmp_path / "mc.yaml").write_text(
        f"task: my_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {rows}\ntest_split: test\n"
        "output_type: multiple_choice\ndoc_to_text: '{{prompt}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"stage: sft\nmodel: {{name_or_path: tiny:llama}}\nhardware: {{gpus_per_node: 0}}\n"
                      f"data:\n  datasets: [{{path: {DATA}, format: alpaca}}]\n  cache_dir: {tmp_path / 'cache'}\n"
                      "train: {max_steps: 1, global_batch_size: 4}\nlogging: {progress_bar: false}\n"
                      "eval: {tasks: [mc.yaml], limit: 2}\n")
    done = recipeforge("--trust-code", "train", "r.yaml", f"output.dir={tmp_path / 'my run'}", cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-3000:]
    line = re.search(r"the run is complete; evaluate it with: (.+)", err)
    assert line and "--trust-code" in line.group(1), err[-3000:]
    rows.write_text('{"prompt": "The sky is", "choices": ["blue", "green"], "answer": 0}\n'
                    '{"prompt": "A cat says", "choices": ["meow", "moo"], "answer": 0}\n')
    retried = _shell(line.group(1), tmp_path)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert (tmp_path / "my run" / "eval" / "my_mc.json").is_file()


def _stub(folder: Path, name: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/usr/bin/env python3\nimport json, sys\nopen(sys.argv[0] + '.args', 'w').write(json.dumps("
                    "sys.argv[1:]))\n")
    path.chmod(0o755)


def test_job_submission_lines_quote_their_paths(full_run, tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"instruction": "x", "input": "", "output": "y"}\n')
    (tmp_path / "r.yaml").write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\nhardware: {gpus_per_node: 0}\n"
                                     "data:\n  datasets: [{path: rows.jsonl, format: alpaca}]\n")
    stubs = tmp_path / "stubs"
    _stub(stubs, "sbatch")
    _stub(stubs, "kubectl")
    for args, tool, target in (
            (["launch", "--slurm", "r.yaml", "-o", "my jobs/it's.sbatch"], "sbatch", "my jobs/it's.sbatch"),
            (["launch", "--k8s", "r.yaml", "--image", "ghcr.io/acme/rf:1", "--pvc", "runs", "-o", "k8s job.yaml"],
             "kubectl", "k8s job.yaml")):
        (tmp_path / "my jobs").mkdir(exist_ok=True)
        done = recipeforge(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr.decode()
        line = next(l for l in done.stdout.decode().splitlines() if l.startswith(("submit it with: ", "apply them with: ")))
        ran = _shell(line.split(": ", 1)[1], tmp_path, path=stubs)
        assert ran.returncode == 0, ran.stderr
        got = json.loads((stubs / f"{tool}.args").read_text())
        assert got[-1] == target and (tmp_path / got[-1]).is_file(), got
    # The GGUF route: recipeforge prints its first step, for a run folder whose name has a space.
    run = tmp_path / "runs" / "my run"
    shutil.copytree(full_run, run)
    err = refused(recipeforge("export", str(run), "--format", "gguf", cwd=tmp_path), "does not write gguf")
    first = re.search(r"run `(recipeforge export [^`]+)`", err.replace("\n  ", " "))
    assert first, err
    ran = _shell(first.group(1) + " --no-check", tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (run / "export-safetensors" / "model.safetensors").is_file()


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (a private tmpfs mount)")
def test_a_full_disk_during_export_names_the_export_and_its_disk(full_run, tmp_path):
    """A real full disk: a 600 KiB tmpfs, smaller than the tiny model's weights."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = mnt / "out"
    script = (f"mount -t tmpfs -o size=600k tmpfs {mnt} && cd {tmp_path} && {sys.executable} -m recipeforge export "
              f"{full_run} --format safetensors -o {out} --no-check; echo $? > {tmp_path / 'rc'}; "
              f"ls -A {mnt} > {tmp_path / 'left'}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=_env())
    err = proc.stderr
    assert (tmp_path / "rc").read_text().strip() == "2", err[-3000:]
    assert "Traceback" not in err and "None" not in err, err
    assert f"writing the export {out} failed: no space left on device" in err, err
    assert f"hint: free space on the disk holding {mnt} (" in err, err
    assert (tmp_path / "left").read_text().split() == []  # no half export, no staging folder
