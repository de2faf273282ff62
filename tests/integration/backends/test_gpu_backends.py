"""Backends on CUDA GPUs (skipped without them): FSDP2 really shards (DTensor parameters), ZeRO-3 in bf16,
and Megatron-Bridge when it is installed. FSDP runs on GPUs only: Accelerate enables its FSDP path
only for GPU device types, so on the CPU the fsdp backend refuses to run (see docs/backends.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
PRETRAIN = REPO / "examples" / "yaml" / "tiny" / "pretrain.yaml"
ON_GPU = ("~hardware", "model.dtype=bf16", "train.max_steps=6", "train.micro_batch_size=auto",
          "train.logging_steps=1", "output.save_steps=3", "data.val_size=0", "logging.progress_bar=false")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _train(tiny, recipe: Path, run: Path, *overrides: str) -> Path:
    cmd = [sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", *ON_GPU, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=run.parent)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return run


def _loss_matches(tiny, run: Path, reference: Path, tol: float = 0.05) -> None:
    mine, ref = tiny.values(run, "loss"), tiny.values(reference, "loss")
    assert len(mine) == len(ref) == 6 and mine == pytest.approx(ref, abs=tol), (mine, ref)


@pytest.fixture(scope="module")
def gpu_reference(tiny, tmp_path_factory) -> Path:
    return _train(tiny, SFT, tmp_path_factory.mktemp("gpu") / "single", "distributed.backend=single")


@pytest.mark.parametrize("preset", ["fsdp_full_shard", "fsdp_shard_grad_op"])
def test_fsdp2_shards_parameters_as_dtensor(tiny, tmp_path, gpu_reference, preset):
    from transformers import AutoModelForCausalLM

    run = _train(tiny, SFT, tmp_path / "fsdp", "distributed.backend=fsdp", f"distributed.preset={preset}")
    report = json.loads((run / "backend.json").read_text())["observed"]
    assert report["distributed_type"] == "FSDP" and report["num_processes"] == _gpus()
    assert report["fsdp_modules"] >= 3                       # each decoder layer plus the root
    assert report["dtensor_params"] == report["params"] > 0  # every parameter is a DTensor shard
    if _gpus() > 1:
        assert report["local_param_elements"] < report["full_param_elements"]
    _loss_matches(tiny, run, gpu_reference)
    assert AutoModelForCausalLM.from_pretrained(run / "final") is not None


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_zero3_in_bf16_on_gpus(tiny, tmp_path, gpu_reference):
    run = _train(tiny, SFT, tmp_path / "zero3", "distributed.backend=deepspeed", "distributed.zero_stage=3")
    report = json.loads((run / "backend.json").read_text())["observed"]
    assert (report["engine"], report["zero_stage"], report["process_group_backend"]) == ("DeepSpeedEngine", 3, "nccl")
    _loss_matches(tiny, run, gpu_reference)


def test_ddp_on_all_gpus(tiny, tmp_path, gpu_reference):
    if _gpus() < 2:
        pytest.skip("DDP needs two GPUs")
    run = _train(tiny, SFT, tmp_path / "ddp", "distributed.backend=ddp")
    report = json.loads((run / "backend.json").read_text())["observed"]
    assert report["ddp"] and report["process_group_backend"] == "nccl"
    _loss_matches(tiny, run, gpu_reference)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs Megatron-Bridge (the megatron extra)")
def test_megatron_pretrain_exports_hf_safetensors(tmp_path):
    pytest.importorskip("megatron.bridge")
    from transformers import AutoModelForCausalLM

    recipe = REPO / "examples" / "yaml" / "pretrain-llama3-8b-continued.yaml"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={tmp_path / 'run'}",
           "~hardware", "distributed.backend=megatron", "train.max_steps=2", "data.sequence_len=256"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final") is not None
