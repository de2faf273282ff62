"""QLoRA on FSDP2 over two gloo processes, with the 4-bit base loaded shard by shard
(`backends.quantized_loading`): the loss follows the one-process run that loads the base whole, no
process held the whole 4-bit base at any moment (each process's own account of its live base bytes,
and its resident memory growth, against the whole base), and final/ loads in transformers and peft.

The base is a local checkpoint large enough for the memory figures to stand out of the noise of a
process (a Llama of hidden size 1024, 4 layers: a 4-bit base with its 16-bit embeddings of about 28 MiB).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")]

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
VARIANT = ("adapter.type=qlora", "train.learning_rate=1e-3", "train.max_steps=6", "train.micro_batch_size=auto",
           "train.logging_steps=1", "output.save_steps=3", "data.val_size=0", "output.merge_adapter=false")
TOL = 5e-3  # as for the whole-load QLoRA case in test_fsdp_cpu.py: bf16 4-bit layers, sums in another order
CONFIG = dict(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A random-init Llama saved in bf16 with the tiny tokenizer, as a real checkpoint would come."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from recipeforge.components.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("qlora-base") / "llama"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    model.save_pretrained(path)
    load_tokenizer("tiny:llama", vocab_size=CONFIG["vocab_size"]).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def runs(tiny, checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """The same recipe twice: one process loading the base whole, and FSDP2 on two processes."""
    work = tmp_path_factory.mktemp("qlora-sharded-loading")
    model = f"model.name_or_path={checkpoint}"
    single = tiny.train(str(RECIPE), work / "single", model, *VARIANT)
    run = work / "fsdp"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(RECIPE), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", "logging.progress_bar=false", model, *VARIANT,
           "distributed.backend=fsdp", "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return single, run


def _whole_load_rss_growth(checkpoint: Path) -> int:
    """Resident memory a process holds after loading the 4-bit base whole (what every process of the
    whole-load path holds), measured in a fresh process as the sharded load measures itself
    (`released_rss_bytes`, from after the imports)."""
    code = f"""
import torch, bitsandbytes
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from recipeforge.backends.quantized_loading import released_rss_bytes
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
    ranks = [json.loads((run / "quantized_loading" / f"rank{r}.json").read_text()) for r in (0, 1)]
    whole_rss = _whole_load_rss_growth(checkpoint)
    for seen in ranks:
        full, local = seen["full_base_bytes"], seen["local_base_bytes"]
        assert full > 25 * 2**20  # the 4-bit base (and the frozen 16-bit layers) this test is about
        assert abs(2 * local - full) < 0.01 * full  # half of every tensor, up to rounding of the rows
        # At no moment was more alive than the shards, the quantization states and one tensor in flight
        # (read, and converted or quantized): never the whole base.
        assert seen["peak_live_base_bytes"] <= local + seen["quant_state_bytes"] + 2 * seen["largest_tensor_bytes"]
        assert seen["peak_live_base_bytes"] < full, seen
        # Measured, not counted: a process loading the base whole holds all of it, while reading the
        # checkpoint grew this process, at its highest, by far less (its half and one tensor).
        assert whole_rss > 0.9 * full, whole_rss
        assert seen["fill_rss_peak_growth_bytes"] < 0.75 * full, seen
        assert seen["fill_rss_held_growth_bytes"] < 0.65 * full, seen


def test_final_adapter_loads_in_peft(runs, checkpoint):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    single, run = runs
    mine, ref = load_file(run / "final" / "adapter_model.safetensors"), \
        load_file(single / "final" / "adapter_model.safetensors")
    assert mine.keys() == ref.keys()
    assert max((mine[k].float() - ref[k].float()).abs().max().item() for k in mine) < 0.05
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(base, run / "final")
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, CONFIG["vocab_size"]) and torch.isfinite(logits).all()
