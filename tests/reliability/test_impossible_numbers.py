"""Batch sizes, steps and warmup that cannot work with the data are refused (exit 2, with the numbers)
before anything trains; legitimate but odd ones get a warning with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from recipeforge.cli import main
from recipeforge.components.data_checks import check_numbers
from recipeforge.errors import RecipeError

SFT = """\
stage: sft
model: {name_or_path: tiny:llama}
hardware: {gpus_per_node: 0}
data:
  datasets:
    - {path: rows.jsonl, format: alpaca}
  packing: false
train: {global_batch_size: 4, micro_batch_size: 4, max_steps: 2}
"""
PRETRAIN = SFT.replace("stage: sft", "stage: pretrain") \
    .replace("rows.jsonl, format: alpaca", "text.jsonl, format: text").replace("packing: false", "packing: true\n  sequence_len: 128")
DPO = SFT.replace("stage: sft", "stage: dpo").replace("rows.jsonl, format: alpaca", "pairs.jsonl, format: preference")
GRPO = SFT.replace("stage: sft", "stage: grpo").replace("rows.jsonl, format: alpaca", "prompts.jsonl, format: prompt") \
    + "grpo: {num_generations: 4, max_completion_length: 4, rewards: [{name: length, args: {target: 4}}]}\n"
FILES = {
    "rows.jsonl": "".join(json.dumps({"instruction": f"Count to {i}.", "output": " ".join(map(str, range(i)))}) + "\n"
                          for i in range(1, 17)),
    "text.jsonl": "".join(json.dumps({"text": f"The cow says moo {i} times."}) + "\n" for i in range(16)),
    "pairs.jsonl": "".join(json.dumps({"prompt": f"Say {w}", "chosen": w, "rejected": "no"}) + "\n"
                           for w in ("moo", "woof", "meow", "baa")),
    "prompts.jsonl": "".join(json.dumps({"prompt": f"Say {w}:"}) + "\n" for w in ("moo", "woof", "meow", "baa")),
}


@pytest.fixture
def work(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(work, capsys, recipe: str, *args: str) -> tuple[int, str]:
    (work / "r.yaml").write_text(recipe)
    cmd, *rest = args
    code = main([cmd, "r.yaml", f"data.cache_dir={work / 'cache'}", *rest]
                + (["output.dir=run", "logging.progress_bar=false"] if cmd == "train" else []))
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


REFUSED = [
    # (id, recipe, command and overrides, where (key), message, hint)
    ("absurd-batch-plan", SFT, ("plan", "train.global_batch_size=8000000000", "train.micro_batch_size=auto"),
     "train.global_batch_size", "global batch 8000000000 needs 1000000000 accumulated forward/backward passes per "
     "optimizer step (micro batch 8 x 1 data-parallel rank(s) each); more than 65536", "use at most 524288"),
    ("absurd-batch-train", SFT, ("train", "train.global_batch_size=8000000000"), "train.global_batch_size",
     "global batch 8000000000 needs 2000000000 accumulated", ""),
    ("batch-over-rows", SFT, ("train", "train.global_batch_size=64"), "train.global_batch_size",
     "one optimizer step takes 64 sequences (train.global_batch_size 64), and the training data has only 16",
     "lower train.global_batch_size to at most 16, or add training data"),
    ("batch-over-rows-after-holdout", SFT, ("train", "train.global_batch_size=16", "data.val_size=4"),
     "train.global_batch_size", "takes 16 sequences (train.global_batch_size 16), and the training data has only 12",
     "at most 12"),
    ("batch-over-rows-preprocess", SFT, ("preprocess", "train.global_batch_size=32"), "train.global_batch_size",
     "one optimizer step takes 32 sequences", "at most 16"),
    ("batch-over-packed", PRETRAIN, ("train", "train.global_batch_size=8"), "train.global_batch_size",
     "one optimizer step takes 8 packed sequences (train.global_batch_size 8), and the training data has only 2", ""),
    ("dpo-batch-over-pairs", DPO, ("train", "train.global_batch_size=8"), "train.global_batch_size",
     "takes 8 rows (train.global_batch_size 8), and the training data has only 4", ""),
    ("grpo-prompts-per-step", GRPO, ("train", "train.global_batch_size=32"), "train.global_batch_size",
     "one optimizer step takes 8 prompts (train.global_batch_size 32 / grpo.num_generations 4 = 8), and the "
     "training data has only 4", "at most 16 (a multiple of 4)"),
    ("warmup-over-max-steps", SFT, ("train", "train.max_steps=10", "train.warmup_steps=100"), "train.warmup_steps",
     "train.warmup_steps 100 is not shorter than the run (10 optimizer steps): the learning rate would never reach",
     "use fewer warmup steps"),
    ("warmup-over-epochs", SFT, ("train", "~train.max_steps", "train.epochs=2", "train.warmup_steps=8"),
     "train.warmup_steps", "train.warmup_steps 8 is not shorter than the run (8 optimizer steps: 2 epoch(s) of 4)",
     ""),
    ("warmup-preprocess", SFT, ("preprocess", "train.max_steps=3", "train.warmup_steps=3"), "train.warmup_steps",
     "is not shorter than the run (3 optimizer steps)", ""),
]


@pytest.mark.parametrize("recipe, args, key, message, hint", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(work, capsys, recipe, args, key, message, hint):
    code, err = _run(work, capsys, recipe, *args)
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    # Located: the recipe line, or the command-line override that set the number.
    assert f" {key}: " in errors[0] and errors[0].startswith(("error: r.yaml:", "error: <cli ")), err
    assert message in err and hint in err, err
    assert not (work / "run" / "final").exists()


WARNED = [
    ("many-passes", SFT, ("preprocess", "train.max_steps=1000"),
     "warning: train.max_steps 1000 x 4 sequences per step = 250.0 passes over the 16 sequences"),
    ("long-warmup-ratio", SFT, ("preprocess", "train.max_steps=10", "train.warmup_ratio=0.8"),
     "warning: warmup takes 8 of the run's 10 optimizer steps (train.warmup_ratio)"),
    ("long-warmup-steps", SFT, ("preprocess", "train.max_steps=10", "train.warmup_steps=7"),
     "warning: warmup takes 7 of the run's 10 optimizer steps (train.warmup_steps)"),
]


@pytest.mark.parametrize("recipe, args, message", [c[1:] for c in WARNED], ids=[c[0] for c in WARNED])
def test_warned(work, capsys, recipe, args, message):
    code, err = _run(work, capsys, recipe, *args)
    assert code == 0, err
    assert message in err, err


@pytest.mark.parametrize("args", [
    ("preprocess", "train.max_steps=10", "train.warmup_steps=100", "train.scheduler=constant"),  # no warmup there
    ("preprocess", "train.global_batch_size=16"),                                                # exactly the data
    ("preprocess", "train.max_steps=40"),                                                        # 10 passes
], ids=["constant-schedule", "batch-equals-rows", "ten-passes"])
def test_fine(work, capsys, args):
    code, err = _run(work, capsys, SFT, *args)
    assert code == 0 and "warning" not in err, err


def test_through_the_real_command_line(work):
    (work / "r.yaml").write_text(SFT)
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "train", "r.yaml", "train.global_batch_size=64",
                           "output.dir=run", f"data.cache_dir={work / 'cache'}"], capture_output=True, text=True,
                          cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "one optimizer step takes 64 sequences" in errors[0]


def test_the_trainers_step_count_over_data_parallel_ranks():
    """100 rows over 2 ranks in micro batches of 3: 17 batches per rank, accumulation 2 -> 9 steps."""
    recipe = SimpleNamespace(stage="sft", train=SimpleNamespace(max_steps=None, epochs=1.0, warmup_steps=9,
                                                                warmup_ratio=0.0, scheduler="linear"))
    with pytest.raises(RecipeError, match=r"\(9 optimizer steps: 1 epoch\(s\) of 9\)"):
        check_numbers(recipe, 100, "sequences", global_batch=12, micro=3, accumulation=2, data_parallel=2)
    recipe.train.warmup_steps = 8
    check_numbers(recipe, 100, "sequences", global_batch=12, micro=3, accumulation=2, data_parallel=2)
