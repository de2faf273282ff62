"""`recipeforge plan` as a user types it: the whole run's peaks by phase (text and `--json`, a sharded
model's final/ streamed), a save that does not fit the node's host RAM refused naming the save and its fix, and Llama-3.1-8B full fine-tuning on one
RTX 4090 with the optimizer step in backward planned (refused without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FULL_70B = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"
FULL_8B = ROOT / "examples" / "yaml" / "llama3-8b-full-sft.yaml"
LORA = ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
# torchtune's llama3_1/8B_full_single_device: bf16, paged 8-bit AdamW in backward, batch 2 packed to 2048
TORCHTUNE_8B = ("train.global_batch_size=2", "train.micro_batch_size=2", "train.gradient_checkpointing=true",
                "train.optimizer=paged_adamw_8bit", "train.precision=pure_bf16", "data.packing=true",
                "model.dtype=bf16", "distributed.backend=single",
                "kernels={liger: {fused_linear_cross_entropy: true, rms_norm: false, swiglu: false, rope: false}}")


def _rf(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_plan_json_has_each_phase_per_process_and_node(tmp_path):
    done = _rf(tmp_path, "plan", str(FULL_70B), "--json")
    assert done.returncode == 0, done.stderr
    phases = {p["phase"]: p for p in json.loads(done.stdout)["extra"]["phases"]}
    assert list(phases) == ["load", "train", "eval", "save"]  # no adapter to merge
    for p in phases.values():
        assert p["gpu_per_node_gb"] == pytest.approx(8 * p["gpu_per_process_gb"], abs=0.05)
        assert p["host_per_node_gb"] >= p["host_per_process_gb"] > 0
    # final/ of the sharded 70B is streamed tensor by tensor: rank 0 adds its largest tensor (2 GB, the
    # embedding), never the 140 GB model, to what it holds through the run
    save = phases["save"]
    assert save["note"].startswith("streamed:") and "never gathered whole" in save["note"]
    assert 0 < save["host_per_process_gb"] - phases["train"]["host_per_process_gb"] < 2.5


def test_plan_prints_the_phase_table(tmp_path):
    done = _rf(tmp_path, "plan", str(LORA))
    assert done.returncode == 0, done.stderr
    assert "Peak by phase" in done.stdout
    for phase in ("load", "train", "save", "merge"):
        assert f"\n  {phase} " in done.stdout, done.stdout


def test_a_save_that_does_not_fit_host_ram_is_refused_naming_the_save(tmp_path):
    # One GPU: save_pretrained serialises final/'s one 16 GB file (under output.max_shard_size's 50GB) in
    # host memory, more than a 16 GB node has to spare; smaller files fit.
    one_gpu = ("hardware.gpus_per_node=1", "train.optimizer=adamw_8bit", "hardware.cpu_ram_gb=16")
    done = _rf(tmp_path, "plan", str(FULL_8B), *one_gpu)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "hardware.cpu_ram_gb" in done.stderr and "save phase" in done.stderr
    assert "serialised" in done.stderr and "hint: set output.max_shard_size smaller" in done.stderr
    smaller = _rf(tmp_path, "plan", str(FULL_8B), *one_gpu, "output.max_shard_size=5GB", "--json")
    assert smaller.returncode == 0, smaller.stderr
    save = next(p for p in json.loads(smaller.stdout)["extra"]["phases"] if p["phase"] == "save")
    assert save["host_per_node_gb"] < 0.9 * 16


def test_full_8b_on_one_4090(tmp_path):
    fits = _rf(tmp_path, "plan", str(FULL_8B), *TORCHTUNE_8B, "train.optimizer_in_backward=true",
               "train.max_grad_norm=null", "--hardware", "1xRTX4090-24GB", "--json")
    assert fits.returncode == 0, fits.stderr
    plan = json.loads(fits.stdout)
    assert plan["backend"] == "single" and plan["memory_gb"]["total"] < 21.6
    refused = _rf(tmp_path, "plan", str(FULL_8B), *TORCHTUNE_8B, "--hardware", "1xRTX4090-24GB")
    assert refused.returncode == 2 and "does not fit" in refused.stderr and "Traceback" not in refused.stderr


def test_validate_refuses_clipping_with_the_step_in_backward(tmp_path):
    done = _rf(tmp_path, "validate", str(ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"),
               "train.optimizer_in_backward=true")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "train.optimizer_in_backward" in done.stderr and "train.max_grad_norm: null" in done.stderr
