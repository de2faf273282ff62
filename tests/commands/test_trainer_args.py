"""`stages.trainer_args.trainer_arguments`: the recipe and plan as trainer arguments, computed
without importing transformers or torch (a fresh interpreter checks it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "yaml" / "tiny"

SCRIPT = """
import json, sys
from recipeforge.config import load_recipe
from recipeforge.plan import make_plan
from recipeforge.stages.trainer_args import RunFacts, trainer_arguments

loaded = load_recipe(sys.argv[1], overrides=sys.argv[2:])
plan = make_plan(loaded.recipe)
args = trainer_arguments(loaded.recipe, plan, RunFacts(output_dir="/run/checkpoints", compute_dtype="fp32",
                                                      has_eval=True, run_name="n"))
heavy = sorted(m for m in ("torch", "transformers", "trl", "datasets") if m in sys.modules)
print(json.dumps({"args": args, "heavy": heavy, "plan": [plan.micro_batch_size, plan.gradient_accumulation]}))
"""


def _arguments(*overrides: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(TINY / "sft-full.yaml"), *overrides],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_trainer_arguments_follow_the_recipe_and_the_plan_without_importing_a_library():
    out = _arguments("train.learning_rate=3e-4", "train.scheduler=cosine_with_min_lr", "train.warmup_steps=3",
                     "train.max_steps=7", "train.eval_steps=2", "output.save_steps=4", "data.shuffle=false",
                     "train.optimizer=adamw_8bit", "train.gradient_checkpointing=true")
    args = out["args"]
    assert out["heavy"] == []  # pure: nothing heavy was imported to compute them
    assert (args["per_device_train_batch_size"], args["gradient_accumulation_steps"]) == tuple(out["plan"])
    assert args["learning_rate"] == 3e-4 and args["max_steps"] == 7 and args["warmup_steps"] == 3
    assert args["lr_scheduler_type"] == "cosine_with_min_lr" and args["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert args["optim"] == "adamw_bnb_8bit" and args["output_dir"] == "/run/checkpoints"
    assert (args["eval_strategy"], args["eval_steps"]) == ("steps", 2)
    assert (args["save_strategy"], args["save_steps"]) == ("steps", 4)
    assert args["train_sampling_strategy"] == "sequential" and args["activation_checkpointing"] is True
    # a CPU plan: no mixed precision, whatever the compute dtype
    assert args["use_cpu"] is True and args["bf16"] is False and args["fp16"] is False
    assert args["report_to"] == "none" and args["logging_nan_inf_filter"] is False


def test_the_warmup_ratio_applies_without_warmup_steps_and_stays_below_one():
    args = _arguments("train.warmup_ratio=1.0")["args"]
    assert args["warmup_steps"] == 0.999
