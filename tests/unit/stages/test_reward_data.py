"""The reward stage's data: pairs tokenized as TRL's RewardTrainer would, long pairs cut or dropped as
the recipe says, an optional margin column, and rows of the wrong shape reported at their dataset and row."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.stages import runner_class
from recipeforge.stages.base import RecipeContext
from recipeforge.stages.reward import RewardStage


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = [{"prompt": f"What does animal {i} say?", "chosen": " It says moo.", "rejected": " It says quack."}
        for i in range(6)]


def _prepared(tmp_path, *files: Path, extra: str = ""):
    datasets = "\n".join(f"    - {{path: {f.name}, format: preference}}" for f in files)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent("""\
        stage: reward
        model: {name_or_path: tiny:llama}
        data:
          datasets:
        """) + datasets + "\n" + extra)
    runner = runner_class("reward")(RecipeContext(loaded=load_recipe(recipe)))
    runner.prepare()
    return runner


def test_the_stage_is_registered_with_a_one_output_head():
    assert runner_class("reward") is RewardStage and RewardStage.num_labels == 1


def test_plain_pairs_are_prompt_plus_answer_plus_eos(tmp_path):
    runner = _prepared(tmp_path, _write_rows(tmp_path / "pairs.jsonl", GOOD))
    tok, rows = runner.tokenizer, runner.train_rows
    assert rows.column_names == ["chosen_ids", "rejected_ids"]
    assert rows[0]["chosen_ids"] == tok(GOOD[0]["prompt"] + GOOD[0]["chosen"] + tok.eos_token)["input_ids"]
    assert rows[0]["rejected_ids"][-1] == tok.eos_token_id and rows[0]["rejected_ids"][0] == tok.bos_token_id
    assert runner.data_stats["train_rows"] == 6 and "margin" not in runner.data_stats


def test_chat_pairs_go_through_the_chat_template(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Cow?"}],
             "chosen": [{"role": "assistant", "content": "moo"}],
             "rejected": [{"from": "gpt", "value": "quack"}]}] * 4
    runner = _prepared(tmp_path, _write_rows(tmp_path / "chat.jsonl", rows))
    tok = runner.tokenizer
    want = tok.apply_chat_template([{"role": "user", "content": "Cow?"}, {"role": "assistant", "content": "quack"}],
                                   tokenize=True, return_dict=True)["input_ids"]
    assert runner.train_rows[0]["rejected_ids"] == list(want)


def test_a_margin_column_reaches_the_trainer(tmp_path):
    rows = [{**r, "score_gap": float(i)} for i, r in enumerate(GOOD)]
    f = _write_rows(tmp_path / "pairs.jsonl", rows)
    recipe = tmp_path / "r.yaml"
    runner = _prepared(tmp_path, f, extra="")
    assert "margin" not in runner.train_rows.column_names  # not mapped: not a margin
    recipe.write_text(recipe.read_text().replace("format: preference}", "format: preference, columns: {margin: "
                                                                        "score_gap}}"))
    runner = runner_class("reward")(RecipeContext(loaded=load_recipe(recipe)))
    runner.prepare()
    assert list(runner.train_rows["margin"]) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert runner.data_stats["margin"] == "from the data"


@pytest.mark.parametrize("truncation, kept, stat, longest", [("truncate", 6, "pairs_truncated", 32),
                                                             ("drop", 4, "pairs_dropped", 14)])
def test_long_pairs_are_cut_or_dropped(tmp_path, truncation, kept, stat, longest):
    rows = GOOD[:4] + [{**GOOD[0], "chosen": " moo" * 200}, {**GOOD[0], "rejected": " quack" * 200}]
    runner = _prepared(tmp_path, _write_rows(tmp_path / "pairs.jsonl", rows),
                       extra=f"  sequence_len: 32\n  truncation: {truncation}\n")
    assert len(runner.train_rows) == kept and runner.data_stats[stat] == 2
    rows = runner.train_rows.to_list()
    assert max(len(r[k]) for r in rows for k in ("chosen_ids", "rejected_ids")) == longest


@pytest.mark.parametrize("bad, message", [
    ({"chosen": 5}, "row 3: column 'chosen' must be text or a list of chat messages ({role, content}), not int"),
    ({"rejected": ["a", "b"]}, "row 3: column 'rejected' must be text or a list of chat messages ({role, content}), "
                               "not a list of str"),
    ({"prompt": ""}, "row 3: column 'prompt' is empty"),
    ({"margin": None}, "row 3: column 'margin' must be a finite number, not None"),
])
def test_rows_of_the_wrong_shape_name_dataset_row_and_column(tmp_path, bad, message):
    good = _write_rows(tmp_path / "good.jsonl", GOOD)
    rows = [dict(r) for r in GOOD]
    rows[2].update(bad)
    if "margin" in bad:
        for i, r in enumerate(rows):
            r.setdefault("margin", float(i))
    broken = _write_rows(tmp_path / "broken.jsonl", rows)
    with pytest.raises(RecipeError) as exc:
        _prepared(tmp_path, good, broken)
    p = exc.value.problems[0]
    assert p.key == "data.datasets[1]" and p.message == f"broken.jsonl: {message}"
    assert p.location.file.endswith("r.yaml") and p.location.line == 6  # the second dataset's path


def test_margins_apply_to_every_dataset_or_none(tmp_path):
    with_margin = _write_rows(tmp_path / "m.jsonl", [{**r, "margin": 1.0} for r in GOOD])
    without = _write_rows(tmp_path / "n.jsonl", GOOD)
    with pytest.raises(RecipeError) as exc:
        _prepared(tmp_path, with_margin, without)
    assert exc.value.problems[0].key == "data.datasets"
    assert "some of data.datasets have a margin column and others do not" in exc.value.problems[0].message
