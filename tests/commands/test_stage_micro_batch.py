"""A stage's least micro batch (KTO: 2 rows, its KL estimate pairs each prompt with another row's
completion) is known before anything runs: `validate` refuses a smaller pinned micro batch at its file
and line, and `plan` and `train` refuse a batch split that would leave a process fewer rows, where
before the run learnt of it only once its workers had started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KTO = ROOT / "examples" / "yaml" / "tiny" / "kto.yaml"


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _refused(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_validate_refuses_a_pinned_micro_batch_of_one_at_its_line(tmp_path):
    recipe = tmp_path / "kto-one.yaml"
    recipe.write_text(f"extends: {KTO}\ntrain:\n  micro_batch_size: 1\n")
    _refused(_cli("validate", str(recipe)), f"{recipe}:3:", "train.micro_batch_size",
             "KTO needs micro batches of 2 or more rows", "set train.micro_batch_size: 2 or more")
    recipe.write_text(f"extends: {KTO}\ntrain:\n  micro_batch_size: 2\n")
    assert _cli("validate", str(recipe)).returncode == 0


def test_validate_refuses_a_global_batch_below_the_least_micro_batch():
    _refused(_cli("validate", str(KTO), "train.global_batch_size=1", "train.micro_batch_size=auto"),
             "train.global_batch_size", "a global batch of 1 has fewer")


def test_other_stages_keep_micro_batches_of_one():
    sft = ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
    assert _cli("validate", str(sft), "train.micro_batch_size=1").returncode == 0


def test_a_cpu_job_whose_processes_get_one_row_each_is_refused_before_it_starts(tmp_path):
    for command in ("plan", "train"):
        done = _cli(command, str(KTO), "train.global_batch_size=2", "train.micro_batch_size=auto",
                    "--nproc-per-node", "2", f"output.dir={tmp_path / 'run'}", cwd=tmp_path)
        _refused(done, "train.global_batch_size", "leaves 1 row(s) per process", "use a global batch of 4 or more")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no worker trained


def test_auto_on_gpus_never_plans_a_micro_batch_of_one():
    done = _cli("plan", str(KTO), "--json", "model.name_or_path=meta-llama/Llama-3.1-8B", "hardware.gpus_per_node=8",
                "train.global_batch_size=16", "train.micro_batch_size=auto", "--hardware", "8xH100-80GB")
    assert done.returncode == 0, done.stderr
    assert '"micro_batch_size": 2' in done.stdout
    _refused(_cli("plan", str(KTO), "model.name_or_path=meta-llama/Llama-3.1-8B", "hardware.gpus_per_node=8",
                  "train.global_batch_size=8", "train.micro_batch_size=auto", "--hardware", "8xH100-80GB"),
             "KTO needs micro batches of 2 or more rows", "a multiple of 16")
