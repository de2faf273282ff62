"""QLoRA on a sharded base on CUDA GPUs (skipped without them): FSDP2 shards the 4-bit weights
(stored in bf16 words, ``bnb_4bit_quant_storage``) as DTensors and ZeRO-3 partitions them, and the
adapters learn. The ZeRO-3 path also runs on the CPU (test_qlora_zero3_cpu.py); FSDP needs GPUs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")]

REPO = Path(__file__).resolve().parents[3]
LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
ON_GPU = ("~hardware", "model.dtype=bf16", "adapter.type=qlora", "output.merge_adapter=false", "train.max_steps=6",
          "train.micro_batch_size=auto", "train.logging_steps=1", "data.val_size=0", "logging.progress_bar=false")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _train(tiny, run: Path, *overrides: str) -> dict:
    cmd = [sys.executable, "-m", "recipeforge", "train", str(LORA), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", *ON_GPU, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=run.parent)
    assert proc.returncode == 0, proc.stderr[-6000:]
    loss = tiny.values(run, "loss")
    assert len(loss) == 6 and loss[-1] < loss[0] - 1.0, loss
    assert (run / "final" / "adapter_model.safetensors").is_file()
    return json.loads((run / "backend.json").read_text())["observed"]


@pytest.mark.parametrize("preset", ["fsdp_full_shard", "fsdp_full_shard_offload"])
def test_fsdp2_shards_the_4bit_base(tiny, tmp_path, preset):
    seen = _train(tiny, tmp_path / "fsdp-qlora", "distributed.backend=fsdp", f"distributed.preset={preset}")
    assert seen["distributed_type"] == "FSDP" and seen["num_processes"] == _gpus()
    assert seen["quantized_modules"] == 14 and seen["quantized_dtensor_weights"] == 14
    assert seen["dtensor_params"] == seen["params"]
    if _gpus() > 1:
        assert seen["local_param_elements"] < seen["full_param_elements"]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_zero3_partitions_the_4bit_base_on_gpus(tiny, tmp_path):
    seen = _train(tiny, tmp_path / "z3-qlora", "distributed.backend=deepspeed", "distributed.zero_stage=3")
    assert (seen["zero_stage"], seen["num_processes"]) == (3, _gpus())
    assert seen["partitioned_quantized_params"] == seen["quantized_params"] == 14
    if _gpus() > 1:
        assert seen["quantized_local_elements"] < seen["quantized_full_elements"]
