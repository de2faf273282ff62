"""The reference for throughput: a bare TRL SFTTrainer script with the settings a recipeforge case uses.

    python bench/gpu/trl_reference.py --config DIR --data rows.jsonl --seq 4096 --micro 2 --accum 4 \
        --steps 30 --adapter lora --checkpointing --out result.json

It builds the same architecture with random weights from DIR/config.json (same seed), the same tiny
tokenizer, packs the same alpaca rows (TRL's own best-fit packing, padding-free) and trains with
SFTTrainer, nothing from recipeforge in the loop. Tokens/s counts non-padding tokens over the steps
after the first three, from the trainer's own token counter and step times.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--micro", type=int, required=True)
    ap.add_argument("--accum", type=int, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--adapter", choices=("none", "lora", "qlora"), default="none")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--optim", default="adamw_torch_fused")
    ap.add_argument("--deepspeed", type=Path, help="a DeepSpeed config JSON (the one recipeforge ran)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from recipeforge.components.tokenizer import build_tiny_tokenizer  # the same locally built tokenizer

    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    tokenizer = build_tiny_tokenizer(1024)
    fields = json.loads((args.config / "config.json").read_text())
    model_type = fields.pop("model_type")
    # A real config.json names its own special token ids; the tokenizer the run trains with wins, as in recipeforge.
    fields.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(42)
    # Random weights made on the GPU (an 8B model initialized on the CPU takes minutes of a lease); the
    # measured steps are the same either way.
    import contextlib

    place = torch.device("cuda") if cuda else contextlib.nullcontext()
    quant = None
    if args.adapter == "qlora":
        import tempfile

        from transformers import BitsAndBytesConfig

        with place:
            base = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
        tmp = tempfile.mkdtemp()
        base.save_pretrained(tmp)  # 4-bit weights come from a checkpoint, as for any user
        del base
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=dtype)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype, attn_implementation="sdpa",
                                                     quantization_config=quant, device_map={"": 0 if cuda else "cpu"})
    else:
        with place:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    peft_config = None
    if args.adapter != "none":
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear",
                                 task_type="CAUSAL_LM")

    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    data = Dataset.from_list([{"prompt": (r["instruction"] + ("\n" + r["input"] if r["input"] else "")) + "\n",
                               "completion": r["output"]} for r in rows])
    times: list[tuple[int, float, int]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            times.append((state.global_step, time.perf_counter(), state.num_input_tokens_seen))

    cfg = SFTConfig(output_dir=str(args.out.parent / "trl-run"), max_steps=args.steps, learning_rate=args.lr,
                    per_device_train_batch_size=args.micro, gradient_accumulation_steps=args.accum,
                    max_length=args.seq, packing=True, bf16=cuda, gradient_checkpointing=args.checkpointing,
                    optim=args.optim if cuda else "adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
                    logging_steps=1, save_strategy="no", report_to=[], seed=42,
                    include_num_input_tokens_seen="non_padding",
                    deepspeed=json.loads(args.deepspeed.read_text()) if args.deepspeed else None,
                    use_cpu=not cuda)
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=data, processing_class=tokenizer,
                         peft_config=peft_config, callbacks=[StepClock()])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = trainer.train()
    steady = times[3:] if len(times) > 4 else times
    tokens = steady[-1][2] - steady[0][2]
    seconds = steady[-1][1] - steady[0][1]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out = {"tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
           "step_s": round(seconds / max(1, steady[-1][0] - steady[0][0]), 4),
           "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
           "train_runtime": result.metrics.get("train_runtime"),
           "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 1024 ** 3, 3) if cuda else None}
    args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
