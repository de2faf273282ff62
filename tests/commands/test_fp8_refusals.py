"""`train.precision: fp8` refused as a user types it: planned for a GPU without float8 tensor cores, trained
on this CPU, combined with LoRA; exit 2 with the key, no traceback. An H100 plans it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SFT = ROOT / "examples" / "yaml" / "llama3-8b-full-sft.yaml"
TINY = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def _rf(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_an_a100_plan_is_refused_at_train_precision(tmp_path):
    done = _rf(tmp_path, "plan", str(SFT), "train.precision=fp8", "--hardware", "1xA100-80GB")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "train.precision" in done.stderr and "A100-80GB" in done.stderr and "float8" in done.stderr


def test_an_h100_plan_has_the_fp8_entry(tmp_path):
    done = _rf(tmp_path, "plan", str(SFT), "train.precision=fp8", "--hardware", "8xH100-80GB", "--json")
    assert done.returncode == 0, done.stderr
    import json

    plan = json.loads(done.stdout)
    assert plan["reasons"]["precision"]["value"] == "fp8" and plan["reasons"]["fp8"]["value"] == "tensorwise"


def test_training_on_the_cpu_is_refused_before_a_run_starts(tmp_path):
    done = _rf(tmp_path, "train", str(TINY), "train.precision=fp8", "model.dtype=bf16",
               f"output.dir={tmp_path / 'run'}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "train.precision" in done.stderr
    assert not (tmp_path / "run").exists()


def test_lora_is_refused_by_validate(tmp_path):
    done = _rf(tmp_path, "validate", str(SFT), "train.precision=fp8", "adapter.type=lora")
    assert done.returncode == 2, done.stderr
    assert "train.precision" in done.stderr and "full training" in done.stderr and "Traceback" not in done.stderr
