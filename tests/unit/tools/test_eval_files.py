"""The files of `recipeforge eval` without a model: local JSONL tasks checked line by line and written as
lm-eval task configs, lm-eval's score keys split, the comparison table, the model card's evaluation
section replaced in place (what `validate` says of a recipe's tasks: tests/commands/test_eval_files.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from recipeforge.errors import RecipeError
from recipeforge.tools.evaluation.results import (comparison_table, read_checkpoint_results, read_results,
                                                    split_scores, write_result)
from recipeforge.tools.evaluation.tasks import check_jsonl, resolve_tasks
from recipeforge.tools.model_card import EVAL_START, update_eval_section


def _jsonl(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_generation_task_becomes_an_lm_eval_config(tmp_path):
    task = _jsonl(tmp_path / "my qa.jsonl", {"prompt": "2+2=", "reference": "4"})
    (ref,) = resolve_tasks(["my qa.jsonl"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    assert ref.name == "my_qa" and ref.source == task
    config = yaml.safe_load((tmp_path / "inc" / f"{ref.harness_name}.yaml").read_text())
    assert config["task"] == ref.harness_name and config["output_type"] == "generate_until"
    assert config["dataset_kwargs"]["data_files"]["test"] == str(task.resolve())
    assert config["generation_kwargs"] == {"until": ["\n"], "do_sample": False, "max_gen_toks": 7}
    assert config["metric_list"][0]["metric"] == "exact_match"


def test_choice_rows(tmp_path):
    task = _jsonl(tmp_path / "mc.jsonl", {"prompt": "sky", "choices": ["blue", "red"], "answer": 0})
    assert check_jsonl(task) == "choices"
    (ref,) = resolve_tasks([str(task)], Path("/nowhere"), tmp_path / "inc", max_new_tokens=7)
    config = yaml.safe_load((tmp_path / "inc" / f"{ref.harness_name}.yaml").read_text())
    assert config["output_type"] == "multiple_choice" and config["metric_list"][0]["metric"] == "acc"


@pytest.mark.parametrize("rows, line, what", [
    (['{"prompt": "a", "reference": "b"}', "{not json"], 2, "not JSON"),
    ([{"prompt": "", "reference": "b"}], 1, "non-empty string \"prompt\""),
    ([{"prompt": "a", "reference": 3}], 1, "\"reference\" must be a string"),
    ([{"prompt": "a", "choices": ["x"], "answer": 0}], 1, "two or more strings"),
    ([{"prompt": "a", "choices": ["x", "y"], "answer": 2}], 1, "index of the right choice"),
    ([{"prompt": "a", "answer": "b"}], 1, "unexpected keys"),
    ([{"prompt": "a", "reference": "b"}, {"prompt": "a", "choices": ["x", "y"], "answer": 1}], 2, "mixes"),
])
def test_malformed_rows_name_their_line(tmp_path, rows, line, what):
    task = _jsonl(tmp_path / "bad.jsonl", *rows)
    with pytest.raises(RecipeError) as err:
        check_jsonl(task)
    assert f"bad.jsonl:{line}: malformed task row" in str(err.value) and what in str(err.value)


def test_missing_and_empty_task_files(tmp_path, monkeypatch):
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "1")  # a task YAML is code: read only with the opt-in
    with pytest.raises(RecipeError, match="task file not found"):
        resolve_tasks(["nope.jsonl"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(RecipeError, match="holds no rows"):
        resolve_tasks(["empty.jsonl"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    (tmp_path / "t.yaml").write_text("dataset_path: json\n")
    with pytest.raises(RecipeError, match="no `task:` name"):
        resolve_tasks(["t.yaml"], tmp_path, tmp_path / "inc", max_new_tokens=7)


def test_lm_eval_yaml_with_function_tags_is_read(tmp_path, monkeypatch):
    (tmp_path / "t.yaml").write_text("task: mine\nprocess_docs: !function utils.process\n")
    monkeypatch.delenv("RECIPEFORGE_TRUST_CODE", raising=False)
    with pytest.raises(RecipeError, match="needs an opt-in"):
        resolve_tasks(["t.yaml"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    monkeypatch.setenv("RECIPEFORGE_TRUST_CODE", "1")
    (ref,) = resolve_tasks(["t.yaml"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    assert (ref.name, ref.harness_name) == ("mine", "mine")


def test_harness_names_pass_through(tmp_path):
    (ref,) = resolve_tasks(["arc_easy"], tmp_path, tmp_path / "inc", max_new_tokens=7)
    assert ref.source is None and ref.harness_name == "arc_easy"


def test_score_keys():
    scores, stderr = split_scores({"alias": "x", "acc,none": 0.5, "acc_stderr,none": 0.1,
                                   "exact_match,strict-match": 1.0, "sample_len": 3})
    assert scores == {"acc": 0.5, "exact_match (strict-match)": 1.0} and stderr == {"acc": 0.1}


def test_comparison_table():
    a = {"qa": {"scores": {"exact_match": 0.0}}, "mc": {"scores": {"acc": 0.5}}}
    b = {"qa": {"scores": {"exact_match": 1 / 3}}}
    lines = comparison_table(["runs/a", "runs/b"], [a, b]).splitlines()
    assert lines[0].split() == ["task", "metric", "runs/a", "runs/b"]
    assert lines[1].split() == ["mc", "acc", "0.5", "-"] and lines[2].split() == ["qa", "exact_match", "0", "0.3333"]


def test_card_section_is_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# run\n\n## Results\n\nx\n\n## Data\n\ny\n\n## Plan\n\nz\n")
    write_result(tmp_path / "eval", "qa", {"scores": {"exact_match": 0.25}, "samples": 4, "versions": {"lm_eval": "0.4.13"}})
    update_eval_section(readme, tmp_path)
    write_result(tmp_path / "eval", "qa", {"scores": {"exact_match": 0.75}, "samples": 4, "versions": {"lm_eval": "0.4.13"}})
    update_eval_section(readme, tmp_path)
    text = readme.read_text()
    assert text.count(EVAL_START) == 1 and "| qa | exact_match | 0.75 | 4 |" in text and "0.25" not in text
    assert text.index("## Results") < text.index("## Evaluation") < text.index("## Data")


def test_checkpoint_results_oldest_first_and_apart_from_final(tmp_path):
    for where in ("eval", "eval/checkpoint-10", "eval/checkpoint-9"):
        write_result(tmp_path / where, "qa", {"scores": {"exact_match": len(where) / 100}, "samples": 1})
    (tmp_path / "eval" / "checkpoint-11").mkdir()  # evaluated nothing yet
    assert list(read_checkpoint_results(tmp_path)) == ["checkpoint-9", "checkpoint-10"]
    assert list(read_results(tmp_path)) == ["qa"]
