"""Framework overhead: the same tiny SFT through `recipeforge.run.train` and through a plain TRL script.

Both runs use the same random-init tiny Llama (same seed), tokenizer, prompt/completion rows, batch
size, sequence length, optimizer, schedule and logging cadence, loss on completions only, no packing,
on this machine's CPU. A callback stamps the end of every optimizer step in both; the figure is the
median step time (first steps and the final, checkpointing step left out). Runs alternate
(recipeforge, TRL, recipeforge, TRL, ...) so that drift in machine speed hits both alike.

    python bench/overhead.py                    # 60 steps, 2 rounds
    python bench/overhead.py --steps 100 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time between consecutive optimizer steps (everything the loop does per step)."""

        def __init__(self):
            self.stamps: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.stamps = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kwargs):
            self.stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.last_loss = logs["loss"]

        def step_times(self, skip: int) -> list[float]:
            d = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
            return d[skip:-1]  # the last step also writes a checkpoint

    return StepTimer()


def write_rows(path: Path) -> None:
    """Prompt/completion rows from the tiny SFT set (plain text, no chat template)."""
    rows = [json.loads(line) for line in (REPO / "examples" / "data" / "sft-alpaca.jsonl").read_text().splitlines()]
    path.write_text("".join(json.dumps({"prompt": f"Question: {r['instruction']}\nAnswer:",
                                        "completion": " " + r["output"]}) + "\n" for r in rows))


RECIPE = """\
stage: sft
model: {{name_or_path: "tiny:llama"}}
hardware: {{gpus_per_node: 0}}
data:
  datasets: [{{path: {data}, format: completion}}]
  sequence_len: {seq}
  packing: false
  cache_dir: {cache}
train:
  max_steps: {steps}
  global_batch_size: {batch}
  micro_batch_size: {batch}
  learning_rate: 1.0e-3
  optimizer: adamw
  scheduler: cosine
  warmup_steps: 2
  max_grad_norm: 1.0
  logging_steps: {log}
  gradient_checkpointing: false
  seed: 42
logging: {{progress_bar: false}}
output: {{dir: {out}, save_steps: 100000, save_total_limit: 1}}
"""


def run_recipeforge(tmp: Path, data: Path, args, tag: str) -> tuple[list[float], float]:
    from recipeforge.config import load_recipe
    from recipeforge.run import train
    from recipeforge.stages.base import TrainerStage

    recipe = tmp / f"bench-{tag}.yaml"
    recipe.write_text(RECIPE.format(data=data, seq=args.seq, cache=tmp / "cache", steps=args.steps,
                                    batch=args.batch, log=args.logging_steps, out=tmp / f"run-{tag}"))
    timer = make_timer()
    original = TrainerStage.callbacks
    # Instrumentation only: the same timer the TRL run gets, attached to the runner's callbacks.
    TrainerStage.callbacks = lambda self: original(self) + [timer]
    try:
        train(load_recipe(recipe), overwrite=True)
    finally:
        TrainerStage.callbacks = original
    return timer.step_times(args.skip), timer.last_loss


def run_trl(tmp: Path, data: Path, args, tag: str) -> tuple[list[float], float]:
    import torch
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from recipeforge.components.models import build_tiny_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(1024)
    model = build_tiny_model("llama", tok, seed=42, dtype=torch.float32, attn_implementation="sdpa")
    ds = load_dataset("json", data_files=str(data), split="train")
    config = SFTConfig(
        output_dir=str(tmp / f"trl-{tag}"), max_steps=args.steps, per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1, learning_rate=1e-3, optim="adamw_torch", lr_scheduler_type="cosine",
        warmup_steps=2, max_grad_norm=1.0, logging_steps=args.logging_steps, seed=42, data_seed=42,
        use_cpu=True, bf16=False, gradient_checkpointing=False, max_length=args.seq, packing=False,
        completion_only_loss=True, save_strategy="steps", save_steps=100000, report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, eval_strategy="no")
    timer = make_timer()
    trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tok, callbacks=[timer])
    trainer.train()
    return timer.step_times(args.skip), timer.last_loss


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--logging-steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out (warm-up)")
    args = ap.parse_args(argv)

    import transformers
    import trl  # noqa: F401  imported up front: import time is not step time

    transformers.logging.set_verbosity_error()
    ours, theirs, losses = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "rows.jsonl"
        write_rows(data)
        for i in range(args.rounds):
            times, losses["recipeforge"] = run_recipeforge(tmp, data, args, str(i))
            ours += times
            times, losses["trl"] = run_trl(tmp, data, args, str(i))
            theirs += times
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"steps measured       {len(ours)} recipeforge, {len(theirs)} TRL "
          f"({args.rounds} rounds x {args.steps} steps, batch {args.batch}, seq {args.seq})")
    print(f"recipeforge train    {a * 1000:.2f} ms/step (median)")
    print(f"plain TRL SFTTrainer {b * 1000:.2f} ms/step (median)")
    print(f"ratio                {a / b:.3f}  (recipeforge / TRL; target <= 1.05)")
    print(f"last logged loss     recipeforge {losses['recipeforge']:.3f}, TRL {losses['trl']:.3f} "
          f"(same task, same settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
