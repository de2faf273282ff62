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


@pytest.mark.parametrize("quantized", [False, True], ids=["bf16", "4bit"])
def test_a_random_init_is_made_on_the_gpu_in_seconds(quantized):
    """Llama-3.2-1B with random weights, made on the GPU one module at a time (`components.model_init`):
    in seconds, the host never holding the model (its resident memory grows by far less than the 2.5 GB
    of weights). Small, as this runs beside the GPU suite, whose 8B cases time the same path (init_s)."""
    import json
    import time
    from pathlib import Path

    import torch

    from recipeforge.backends.process_memory import released_rss_bytes
    from recipeforge.components.models import build_random, config_for, random_spec
    from recipeforge.components.tokenizer import load_tokenizer

    if quantized and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("needs bitsandbytes")
    repo = Path(__file__).resolve().parents[2]
    fields = json.loads((repo / "bench" / "gpu" / "models" / "llama-3.2-1b" / "config.json").read_text())
    tok = load_tokenizer("tiny:llama")
    spec = random_spec(config_for(fields, tok), tok, seed=0, dtype=torch.bfloat16, attn_implementation="sdpa")
    quant = None
    if quantized:
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    before = released_rss_bytes()
    started = time.perf_counter()
    model = build_random(spec, tok, name="llama-3.2-1b", device="cuda", quantization_config=quant)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    grown = released_rss_bytes() - before
    params = list(model.parameters())
    assert all(p.device.type == "cuda" for p in params)
    assert seconds < 30, seconds
    assert grown < 2**30, grown  # the host never held the weights
    weights = sum(p.numel() * p.element_size() for p in params) / 2**30
    assert (0.5 < weights < 1.5) if quantized else (2.0 < weights < 2.6), weights
