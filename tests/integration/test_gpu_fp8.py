"""FP8 training on a GPU with float8 tensor cores (compute capability 8.9+): the tiny model trains a few
steps with torchao's float8 linear layers, the loss falls, and final/ loads with transformers as plain
bf16 weights. Skipped without CUDA (and on older GPUs)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

GPU = ("hardware.gpus_per_node=1", "hardware.gpu=H100-80GB")


def test_fp8_full_sft_on_gpu(tiny, tmp_path):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("needs float8 tensor cores (compute capability 8.9 or newer)")
    run = tiny.train("sft-full", tmp_path / "run", *GPU, "model.dtype=bf16", "train.precision=fp8",
                     "train.max_steps=40", "output.save_steps=40")
    plan = json.loads((run / "plan.json").read_text())
    assert plan["reasons"]["precision"]["value"] == "fp8"
    loss = tiny.values(run, "loss")
    assert loss[-1] < loss[0] - 1.0, loss
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert model.dtype == torch.bfloat16
    assert all(type(m) is torch.nn.Linear for n, m in model.named_modules() if n.endswith("q_proj"))
