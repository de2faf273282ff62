"""The tiny recipes trained on Megatron-Bridge's loop through recipeforge's Megatron runner, on GPUs.

For the tiny SFT (full and LoRA) and pretraining recipes with `distributed.backend: megatron`: the loss
Megatron logs falls; tensor parallel 2 (two GPUs) follows the tensor-parallel-1 curve; final/ is a Hugging
Face checkpoint transformers loads (a PEFT adapter for LoRA), and its greedy tokens are the Megatron
model's. Needs CUDA and Megatron-Bridge (docs/backends.md lists the wheels); skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "yaml" / "tiny"


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [
    pytest.mark.gpu, pytest.mark.slow,
    pytest.mark.skipif(_gpus() == 0, reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs Megatron-Bridge (.ci/megatron)"),
]

# What the megatron backend asks of the tiny recipes: micro batch 1 (packed rows, one per micro batch), the
# GPU plan of this machine, and tensorboard, where Megatron logs its loss.
MEGATRON = ["distributed.backend=megatron", "~hardware", "train.micro_batch_size=1", "logging.tensorboard=true",
            "train.max_steps=30", "output.save_steps=30", "train.eval_steps=30"]


def _train(recipe: str, run: Path, *extra: str, nproc: int = 1) -> None:
    cmd = [sys.executable, "-m", "recipeforge", "train", str(TINY / f"{recipe}.yaml"), f"output.dir={run}",
           *MEGATRON, *extra, "--nproc-per-node", str(nproc)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-6000:]


def _losses(run: Path) -> list[float]:
    """Megatron's logged training loss ("lm loss"), step by step, from its tensorboard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tag = next(t for t in events.Tags()["scalars"] if t.endswith("lm loss"))
    return [e.value for e in events.Scalars(tag)]


GREEDY = r'''
import json, sys, torch
from megatron.bridge import AutoBridge
from megatron.bridge.training.model_load_save import temporary_distributed_context
reference, checkpoint, prompt, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
bridge = AutoBridge.from_hf_pretrained(reference)
with temporary_distributed_context(backend="nccl"):
    model = bridge.load_megatron_model(checkpoint)[0].cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        for _ in range(n):
            pos = torch.arange(ids.shape[1], device="cuda")[None]
            logits = model(ids, pos, attention_mask=None)
            ids = torch.cat([ids, logits[:, -1, :bridge.hf_pretrained.config.vocab_size].argmax(-1, keepdim=True)], 1)
print(json.dumps(ids[0, len(prompt):].tolist()))
'''


def _megatron_greedy(reference: Path, checkpoint: Path, prompt: list[int], n: int) -> list[int]:
    proc = subprocess.run([sys.executable, "-c", GREEDY, str(reference), str(checkpoint), json.dumps(prompt), str(n)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hf_greedy(final: Path, base: Path, prompt: list[int], n: int, lora: bool) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    if lora:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), final)
    else:
        model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    model = model.cuda().eval()
    out = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("recipe", ["sft-full", "pretrain", "sft-lora"])
def test_megatron_trains_the_tiny_recipe(tmp_path, recipe):
    run = tmp_path / "run"
    # Megatron-Bridge's LoRA trains adapters only: the tiny LoRA recipe's fully trained extra modules go
    _train(recipe, run, *(["~adapter.modules_to_save"] if recipe == "sft-lora" else []))
    losses = _losses(run)
    assert len(losses) >= 2 and losses[-1] < 0.8 * losses[0], losses
    final = run / "final"
    lora = recipe == "sft-lora"
    assert (final / ("adapter_config.json" if lora else "config.json")).is_file()
    prompt = [1, 5, 9, 13, 17, 21]
    hf = _hf_greedy(final, run / "base_model", prompt, 12, lora)
    if not lora:  # the Megatron model of the last checkpoint decodes the same tokens as final/
        assert _megatron_greedy(run / "base_model", run / "checkpoints", prompt, 12) == hf


@pytest.mark.skipif(_gpus() < 2, reason="tensor parallel 2 needs two GPUs")
def test_tensor_parallel_2_follows_tensor_parallel_1(tmp_path):
    _train("pretrain", tmp_path / "tp1")
    _train("pretrain", tmp_path / "tp2", "distributed.tensor_parallel=2", nproc=2)
    one, two = _losses(tmp_path / "tp1"), _losses(tmp_path / "tp2")
    assert len(one) == len(two) and max(abs(a - b) for a, b in zip(one, two)) < 0.05 * one[0], (one, two)
