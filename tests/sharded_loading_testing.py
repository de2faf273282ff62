"""Shared pieces of the shard-by-shard 4-bit loading tests (FSDP2 and ZeRO-3 on two gloo processes):
the local base checkpoint, the recipe variant both run, the launch, and the checks of what each
process held and of final/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
VARIANT = ("adapter.type=qlora", "train.learning_rate=1e-3", "train.max_steps=6", "train.micro_batch_size=auto",
           "train.logging_steps=1", "output.save_steps=3", "data.val_size=0", "output.merge_adapter=false")
# Large enough for the memory figures to stand out of a process's noise: a 4-bit base with its 16-bit
# embeddings of about 28 MiB.
CONFIG = dict(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False)


def save_checkpoint(path: Path) -> Path:
    """A random-init Llama saved in bf16 with the tiny tokenizer, as a real checkpoint would come."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from recipeforge.components.tokenizer import load_tokenizer

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    model.save_pretrained(path)
    load_tokenizer("tiny:llama", vocab_size=CONFIG["vocab_size"]).save_pretrained(path)
    return path


def train_two_processes(tiny, checkpoint: Path, run: Path, cwd: Path, *backend: str) -> subprocess.CompletedProcess:
    """`recipeforge train` of the variant on two processes, as a user types it (a resume, read from what it
    prints)."""
    cmd = [sys.executable, "-m", "recipeforge", "train", str(RECIPE), f"output.dir={run}",
           f"data.cache_dir={tiny.cache_dir}", "logging.progress_bar=false", f"model.name_or_path={checkpoint}",
           *VARIANT, *backend, "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def launch_two_processes(tiny, checkpoint: Path, run: Path, *backend: str) -> Path:
    """The variant on two processes, launched from the test's process (`Tiny.launch`): for the checks of
    what each worker loaded and trained, which do not depend on the command line."""
    return tiny.launch(str(RECIPE), run, f"model.name_or_path={checkpoint}", *VARIANT, *backend)


def rank_records(run: Path) -> list[dict]:
    """Each process's account of its loading (`sharded_loading/rank<N>.json`)."""
    return [json.loads((run / "sharded_loading" / f"rank{r}.json").read_text()) for r in (0, 1)]


def assert_held_half_the_base(seen: dict) -> None:
    """One process's loading: half of the base, never more alive than its part, the quantization
    states and one tensor in flight, and a resident-memory growth far below the whole base."""
    full, local = seen["full_base_bytes"], seen["local_base_bytes"]
    assert full > 25 * 2**20  # the 4-bit base (and the frozen 16-bit layers) these tests are about
    assert abs(2 * local - full) < 0.01 * full  # half of every tensor, up to rounding of rows / padding
    # At no moment was more alive than the shards, the quantization states and one tensor in flight
    # (read, and converted or quantized): never the whole base.
    assert seen["peak_live_base_bytes"] <= local + seen["quant_state_bytes"] + 2 * seen["largest_tensor_bytes"]
    assert seen["peak_live_base_bytes"] < full, seen
    # Measured, not counted (`released_rss_bytes`): reading grew this process by far less than the base.
    assert seen["fill_rss_peak_growth_bytes"] < 0.75 * full, seen
    assert seen["fill_rss_held_growth_bytes"] < 0.65 * full, seen


def assert_final_adapter_loads(run: Path, single: Path, checkpoint: Path) -> None:
    """final/ holds the adapter the one-process run trained (same keys, close values), and peft
    loads it on the checkpoint."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    mine, ref = load_file(run / "final" / "adapter_model.safetensors"), \
        load_file(single / "final" / "adapter_model.safetensors")
    assert mine.keys() == ref.keys()
    assert max((mine[k].float() - ref[k].float()).abs().max().item() for k in mine) < 0.05
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(base, run / "final")
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, CONFIG["vocab_size"]) and torch.isfinite(logits).all()
