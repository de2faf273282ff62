"""Print the planner's choice and predicted per-GPU memory for a grid of realistic cases.

    python bench/plan_cases.py            # the table
    python bench/plan_cases.py --json     # one JSON object per case

Each row is a full `make_plan` on a recipe built from a dict; nothing is trained. Use it to review
what the memory model predicts, or to compare with measured peaks on real hardware.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from recipeforge.config.schema import recipe_adapter
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware

FORMATS = {"sft": "alpaca", "pretrain": "text", "dpo": "preference", "grpo": "prompt"}

# (label, model, stage, adapter, sequence_len, global batch, hardware, extra recipe sections)
CASES = [
    ("QLoRA 8B", "meta-llama/Llama-3.1-8B", "sft", "qlora", 2048, 16, "1xL4-24GB", {}),
    ("LoRA 8B", "meta-llama/Llama-3.1-8B", "sft", "lora", 2048, 16, "1xA100-40GB", {}),
    ("full 8B", "meta-llama/Llama-3.1-8B", "sft", "none", 2048, 16, "1xH100-80GB", {}),
    ("full 8B", "meta-llama/Llama-3.1-8B", "sft", "none", 2048, 128, "8xH100-80GB", {}),
    ("full 8B 8k", "meta-llama/Llama-3.1-8B", "sft", "none", 8192, 128, "8xH100-80GB", {}),
    ("full 8B eager", "meta-llama/Llama-3.1-8B", "sft", "none", 4096, 128, "8xH100-80GB",
     {"model": {"attn_implementation": "eager"}}),
    ("QLoRA 70B", "meta-llama/Llama-3.1-70B", "sft", "qlora", 2048, 16, "1xH100-80GB", {}),
    ("QLoRA 70B", "meta-llama/Llama-3.1-70B", "sft", "qlora", 2048, 16, "2xRTX4090-24GB", {}),
    ("LoRA 70B", "meta-llama/Llama-3.1-70B", "sft", "lora", 4096, 64, "8xH100-80GB", {}),
    ("full 70B", "meta-llama/Llama-3.1-70B", "sft", "none", 4096, 128, "2x8xH100-80GB", {}),
    ("full 70B", "meta-llama/Llama-3.1-70B", "sft", "none", 4096, 128, "2x8xH200-141GB", {}),
    ("DPO LoRA 8B", "meta-llama/Llama-3.1-8B", "dpo", "lora", 2048, 64, "4xA100-80GB", {}),
    ("DPO full 8B", "meta-llama/Llama-3.1-8B", "dpo", "none", 2048, 64, "8xH100-80GB", {}),
    ("GRPO 7B vLLM", "Qwen/Qwen2.5-7B", "grpo", "none", 512, 256, "8xH100-80GB",
     {"grpo": {"rewards": [{"name": "exact_match"}], "max_completion_length": 768,
               "rollout": {"engine": "vllm", "mode": "colocate", "gpu_memory_utilization": 0.3}}}),
    ("GRPO 1.5B HF", "Qwen/Qwen2.5-1.5B", "grpo", "none", 512, 64, "1xA100-80GB",
     {"grpo": {"rewards": [{"name": "exact_match"}], "max_completion_length": 512}}),
    ("QLoRA Mixtral", "mistralai/Mixtral-8x7B-v0.1", "sft", "qlora", 2048, 16, "1xA100-80GB", {}),
    ("pretrain 8B", "meta-llama/Llama-3.1-8B", "pretrain", "none", 8192, 512, "2x8xH100-80GB", {}),
    ("pretrain 405B", "meta-llama/Llama-3.1-405B", "pretrain", "none", 8192, 1024, "8x8xH100-80GB", {}),
    ("full 70B (fails)", "meta-llama/Llama-3.1-70B", "sft", "none", 2048, 16, "1xL4-24GB", {}),
]


def build(model, stage, adapter, seq, batch, extra):
    raw = {"stage": stage, "model": {"name_or_path": model, **extra.get("model", {})},
           "adapter": {"type": adapter},
           "data": {"datasets": [{"path": "data.jsonl", "format": FORMATS[stage]}], "sequence_len": seq},
           "train": {"global_batch_size": batch}}
    raw.update({k: v for k, v in extra.items() if k != "model"})
    return recipe_adapter().validate_python(raw)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args(argv)
    header = (f"{'case':<18} {'hardware':<15} {'seq':>5} {'plan':<30} {'micro':>5} {'accum':>5} {'ckpt':>4} "
              f"{'states':>7} {'act+log':>8} {'peak GB':>8} {'limit':>6}  ms")
    if not args.json:
        print(header)
        print("-" * len(header))
    for label, model, stage, adapter, seq, batch, hw, extra in CASES:
        recipe = build(model, stage, adapter, seq, batch, extra)
        start = time.perf_counter()
        try:
            plan = make_plan(recipe, parse_hardware(hw))
        except RecipeError as exc:
            ms = (time.perf_counter() - start) * 1000
            if args.json:
                print(json.dumps({"case": label, "hardware": hw, "error": exc.problems[0].message}))
            else:
                print(f"{label:<18} {hw:<15} {seq:>5} does not fit: {exc.problems[0].message.split(': the ')[-1][:70]}"
                      f"  {ms:.1f}")
            continue
        ms = (time.perf_counter() - start) * 1000
        mem = plan.memory_gb
        states = sum(mem.get(k, 0) for k in ("weights", "gradients", "optimizer", "adapter"))
        act = mem.get("activations", 0) + mem.get("logits", 0)
        if args.json:
            print(json.dumps({"case": label, "hardware": hw, "backend": plan.backend, "preset": plan.preset,
                              "micro_batch_size": plan.micro_batch_size,
                              "gradient_accumulation": plan.gradient_accumulation,
                              "gradient_checkpointing": plan.gradient_checkpointing, "memory_gb": mem}))
            continue
        name = f"{plan.backend} {plan.preset or ''}".strip()
        if plan.backend == "megatron":
            name += f" dp{plan.data_parallel}"
        print(f"{label:<18} {hw:<15} {seq:>5} {name:<30} {plan.micro_batch_size:>5} {plan.gradient_accumulation:>5} "
              f"{'on' if plan.gradient_checkpointing else 'off':>4} {states:>7.1f} {act:>8.1f} {mem['total']:>8.1f} "
              f"{plan.extra.memory_limit_gb:>6.1f}  {ms:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
