"""QLoRA on FSDP2 over two gloo processes, with the 4-bit base loaded shard by shard
(`backends.sharded_loading`): the loss follows the one-process run that loads the base whole, no
process held the whole 4-bit base at any moment (each process's own account of its live base bytes,
and its resident memory growth, against the whole base), and final/ loads in transformers and peft.

The base is a local checkpoint large enough for the memory figures to stand out of the noise of a
process (a Llama of hidden size 1024, 4 layers: a 4-bit base with its 16-bit embeddings of about 28 MiB).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sharded_loading_testing import (REPO, RECIPE, VARIANT, assert_final_adapter_loads,
                                    assert_held_half_the_base, launch_two_processes, rank_records,
                                    save_checkpoint)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")]

TOL = 1e-2  # bf16 4-bit layers, sums in another order: 0.005 apart at step 3 (transformers 5.23, torch 2.13)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("qlora-base") / "llama")


@pytest.fixture(scope="module")
def runs(tiny, checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """The same recipe twice: one process loading the base whole, and FSDP2 on two processes."""
    work = tmp_path_factory.mktemp("qlora-sharded-loading")
    single = tiny.train(str(RECIPE), work / "single", f"model.name_or_path={checkpoint}", *VARIANT)
    return single, launch_two_processes(tiny, checkpoint, work / "fsdp", "distributed.backend=fsdp")


def _whole_load_rss_growth(checkpoint: Path) -> int:
    """Resident memory a process holds after loading the 4-bit base whole (what every process of the
    whole-load path holds), measured in a fresh process as the sharded load measures itself
    (`released_rss_bytes`, from after the imports)."""
    code = f"""
import torch, bitsandbytes
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from recipeforge.backends.process_memory import released_rss_bytes
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                       bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
before = released_rss_bytes()
model = AutoModelForCausalLM.from_pretrained({str(checkpoint)!r}, dtype=torch.bfloat16, quantization_config=q,
                                             device_map={{"": "cpu"}})
print(released_rss_bytes() - before)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.strip().splitlines()[-1])


def test_loss_follows_the_whole_load(tiny, runs):
    single, run = runs
    seen = json.loads((run / "backend.json").read_text())["observed"]
    assert (seen["distributed_type"], seen["num_processes"], seen["device"]) == ("FSDP", 2, "cpu")
    assert seen["dtensor_params"] == seen["params"] and seen["placements"] == {"S(0)": seen["params"]}
    assert seen["quantized_modules"] > 0 and seen["quantized_dtensor_weights"] == seen["quantized_modules"]
    mine, ref = tiny.values(run, "loss"), tiny.values(single, "loss")
    assert len(mine) == 6 and mine == pytest.approx(ref, abs=TOL), (mine, ref)


def test_no_process_held_the_whole_base(runs, checkpoint):
    _, run = runs
    # Measured in a fresh process: a whole load holds (nearly) all of the base.
    whole_rss = _whole_load_rss_growth(checkpoint)
    assert whole_rss > 0.9 * rank_records(run)[0]["full_base_bytes"], whole_rss
    for seen in rank_records(run):
        assert_held_half_the_base(seen)


def test_final_adapter_loads_in_peft(runs, checkpoint):
    single, run = runs
    assert_final_adapter_loads(run, single, checkpoint)
