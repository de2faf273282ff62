"""GPU-only paths: QLoRA (bitsandbytes 4-bit on CUDA) and bf16 training. Skipped without CUDA."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

GPU = ("hardware.gpus_per_node=1", "hardware.gpu=H100-80GB")


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_sft_on_gpu(tiny, tmp_path):
    import json

    run = tiny.train("sft-lora", tmp_path / "run", *GPU, "adapter.type=qlora", "model.dtype=bf16",
                     "output.merge_adapter=true")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["device"] == "cuda"
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 2.0, loss
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert (run / "merged" / "model.safetensors").is_file()


def test_bf16_full_sft_on_gpu(tiny, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run = tiny.train("sft-full", tmp_path / "run", *GPU, "model.dtype=auto")
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 3.0, loss
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    assert model.dtype == expected


def test_training_records_log_the_peak_gpu_memory(tiny, tmp_path):
    import torch

    run = tiny.train("sft-full", tmp_path / "run", *GPU, "train.max_steps=10", "output.save_steps=10")
    records = [r for r in tiny.records(run, "train") if "memory/peak_reserved_gib" in r]
    assert records, "no training record carries the peak memory"
    reserved = [r["memory/peak_reserved_gib"] for r in records]
    assert reserved == sorted(reserved)  # a peak since the start only grows
    assert all(r["memory/peak_allocated_gib"] <= r["memory/peak_reserved_gib"] for r in records)
    assert 0 < reserved[-1] <= torch.cuda.get_device_properties(0).total_memory / 1024 ** 3


def test_cpu_runs_log_no_gpu_memory(tiny, tmp_path):
    run = tiny.train("sft-full", tmp_path / "run", "train.max_steps=5", "output.save_steps=5")
    assert not any("memory/peak_reserved_gib" in r for r in tiny.records(run))
