"""Prompts longer than 512 tokens reach DPO and GRPO whole: only the recipe's limits cut tokens.

Older TRL releases cut every prompt to a default `max_prompt_length` of 512 unless told otherwise;
the stages set every length field the installed TRL has from the recipe. The dependency-floors test
runs this module again against the lowest supported versions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"
LONG = " ".join(f"the cow number {i} says moo and the dog says woof." for i in range(60))


def _setup(tmp_path: Path, stage: str, rows: list[dict], *overrides: str):
    from recipeforge.config import load_recipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan import make_plan
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import StageContext

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = "preference" if stage == "dpo" else "prompt"
    loaded = load_recipe(TINY / f"{stage}.yaml", overrides=[
        f"data.datasets=[{{path: {data}, format: {fmt}}}]", "data.val_size=0", "train.eval_steps=null",
        "data.sequence_len=2048", f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
        *overrides])
    runner = runner_class(stage)(StageContext(loaded=loaded, plan=make_plan(loaded.recipe),
                                              run=RunDir(tmp_path / "run")))
    runner.setup()
    return runner


def test_dpo_keeps_a_prompt_of_more_than_512_tokens(tmp_path):
    rows = [{"prompt": LONG, "chosen": " moo.", "rejected": " quack."},
            {"prompt": "What does the cow say?", "chosen": " moo.", "rejected": " bleat."}] * 4
    runner = _setup(tmp_path, "dpo", rows)
    n_prompt = len(runner.tokenizer(LONG, add_special_tokens=False)["input_ids"])
    assert n_prompt > 600
    assert runner.trainer.args.max_length == 2048
    assert getattr(runner.trainer.args, "max_prompt_length", None) is None
    lengths = sorted(len(r["prompt_ids"]) for r in runner.trainer.train_dataset)
    assert lengths[-1] >= n_prompt, lengths  # whole (plus any special tokens), not cut to 512


def test_dpo_cuts_prompts_where_the_recipe_says(tmp_path):
    rows = [{"prompt": LONG, "chosen": " moo.", "rejected": " quack."},
            {"prompt": "What does the cow say?", "chosen": " moo.", "rejected": " bleat."}] * 4
    runner = _setup(tmp_path, "dpo", rows, "dpo.max_prompt_length=100")
    lengths = sorted(len(r["prompt_ids"]) for r in runner.trainer.train_dataset)
    assert 100 <= lengths[-1] <= 102, lengths  # 100 tokens (+ special tokens the template adds)


def test_grpo_keeps_a_prompt_of_more_than_512_tokens(tmp_path):
    rows = [{"prompt": LONG, "answer": "moo"}, {"prompt": "What does the cow say?", "answer": "moo"}] * 4
    runner = _setup(tmp_path, "grpo", rows)
    args = runner.trainer.args
    assert args.max_completion_length == runner.recipe.grpo.max_completion_length
    assert getattr(args, "max_prompt_length", None) is None
    assert LONG in [r["prompt"] for r in runner.trainer.train_dataset]
