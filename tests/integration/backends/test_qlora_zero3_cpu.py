"""QLoRA on DeepSpeed ZeRO-3 over two gloo processes on the CPU: the 4-bit base (bitsandbytes'
CPU backend, weights packed into bf16 words by ``bnb_4bit_quant_storage``) is partitioned like any
other weights, and the adapters learn.

Launched as ``recipeforge train --nproc-per-node 2`` launches, from the test's process; skipped without
deepspeed or bitsandbytes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None
                                 or importlib.util.find_spec("bitsandbytes") is None,
                                 reason="needs deepspeed and bitsandbytes")]

REPO = Path(__file__).resolve().parents[3]
LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"


def test_qlora_on_zero3_partitions_the_4bit_base_and_learns(tiny, tmp_path):
    # Two processes launched from this process (`Tiny.launch`): what is checked is what the workers hold
    # and learn, not the command line.
    run = tiny.launch(str(LORA), tmp_path / "qlora-zero3", "adapter.type=qlora", "distributed.backend=deepspeed",
                      "distributed.zero_stage=3", "train.max_steps=6", "train.micro_batch_size=auto",
                      "train.logging_steps=1", "output.merge_adapter=false", "data.val_size=0")

    plan = json.loads((run / "plan.json").read_text())
    assert (plan["backend"], plan["backend_part"]["zero_stage"], plan["world_size"]) == ("deepspeed", 3, 2)
    seen = json.loads((run / "backend.json").read_text())["observed"]
    assert (seen["engine"], seen["zero_stage"], seen["num_processes"]) == ("DeepSpeedEngine", 3, 2)
    # every decoder linear is a 4-bit weight, and each process holds half of every one of them
    assert seen["quantized_params"] == 14 and seen["partitioned_quantized_params"] == 14
    assert seen["quantized_local_elements"] * 2 == seen["quantized_full_elements"]
    assert seen["local_param_elements"] * 2 == seen["full_param_elements"]

    loss = tiny.values(run, "loss")
    assert len(loss) == 6 and loss[-1] < loss[0] - 1.0, loss

    from safetensors.torch import load_file

    adapter = load_file(run / "final" / "adapter_model.safetensors")
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # the adapters moved away from their zero start
