"""User mistakes surface as RecipeErrors that say where and what, before any training happens."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from recipeforge.errors import RecipeError

SFT = """\
stage: sft
model: {{name_or_path: "{model}"}}
hardware: {{gpus_per_node: 0}}
data:
  datasets:
    - path: {path}
      format: {fmt}
{columns}  sequence_len: 64
train: {{max_steps: 2, global_batch_size: 2, micro_batch_size: 2}}
"""


def _recipe(tmp_path: Path, *, path="data.jsonl", fmt="alpaca", columns="", model="tiny:llama", extra=""):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(SFT.format(path=path, fmt=fmt, columns=columns, model=model) + extra)
    return recipe


def _rows(tmp_path: Path, rows: list[dict], name="data.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _train(recipe: Path, tmp_path: Path, *overrides: str):
    from recipeforge.config import load_recipe
    from recipeforge.run import train

    loaded = load_recipe(recipe, overrides=[f"output.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'c'}",
                                            *overrides])
    with pytest.raises(RecipeError) as info:
        train(loaded, overwrite=True)
    return info.value


GOOD = [{"instruction": "What does the cow say?", "output": "moo"}] * 4


def test_missing_data_file_names_the_recipe_line(tmp_path):
    err = _train(_recipe(tmp_path, path="missing.jsonl"), tmp_path)
    (problem,) = err.problems
    assert "missing.jsonl" in problem.message and "not found" in problem.message
    assert problem.key == "data.datasets[0].path"
    assert problem.location is not None and problem.location.file.endswith("recipe.yaml")
    assert problem.location.line == 6


def test_missing_column_lists_the_columns_found(tmp_path):
    _rows(tmp_path, [{"question": "q", "answer": "a"}] * 3)
    err = _train(_recipe(tmp_path), tmp_path)
    text = str(err)
    assert "'instruction'" in text and "'output'" in text and "columns found: question, answer" in text
    assert err.problems[0].hint and "columns:" in err.problems[0].hint


def test_column_remap_fixes_it(tmp_path):
    from recipeforge.config import load_recipe
    from recipeforge.run import preprocess

    _rows(tmp_path, [{"question": "q", "answer": "a"}] * 3)
    recipe = _recipe(tmp_path, columns="      columns: {instruction: question, output: answer}\n")
    stats = preprocess(load_recipe(recipe, overrides=[f"data.cache_dir={tmp_path / 'c'}"]))
    assert stats["train_rows"] == 3


def test_remap_of_an_absent_column(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path, columns="      columns: {output: response}\n"), tmp_path)
    assert "column 'response'" in str(err) and "columns found: instruction, output" in str(err)


def test_empty_dataset(tmp_path):
    (tmp_path / "data.jsonl").write_text("")
    err = _train(_recipe(tmp_path), tmp_path)
    assert "has no rows" in str(err)
    assert err.problems[0].key == "data.datasets[0].path"


def test_empty_value_names_the_row(tmp_path):
    _rows(tmp_path, GOOD + [{"instruction": "Count.", "output": None}])
    err = _train(_recipe(tmp_path), tmp_path)
    assert "row 5" in str(err) and "'output'" in str(err)


def test_malformed_jsonl(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"instruction": "a", "output": "b"}\n{not json\n')
    err = _train(_recipe(tmp_path), tmp_path)
    assert "row 2 is not valid JSON" in str(err) and err.problems[0].key == "data.datasets[0].path"


def test_unknown_model_path(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path, model=str(tmp_path / "no-such-model")), tmp_path)
    assert "no-such-model" in str(err) and err.problems[0].key == "model.name_or_path"


def _load_error(recipe: Path, *overrides: str):
    """The error loading (validating) `recipe` raises: names a run would look up are checked there."""
    from recipeforge.config import load_recipe

    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, overrides=list(overrides))
    return info.value


def test_unknown_tiny_architecture(tmp_path):
    _rows(tmp_path, GOOD)
    err = _load_error(_recipe(tmp_path, model="tiny:gpt9"))
    assert "tiny:gpt9" in str(err) and "tiny:llama" in err.problems[0].hint


def test_unknown_chat_template(tmp_path):
    _rows(tmp_path, GOOD)
    err = _load_error(_recipe(tmp_path), "data.chat_template=chatmll")
    assert "unknown chat template 'chatmll'" in str(err) and "chatml" in err.problems[0].hint


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_qlora_without_bitsandbytes(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path), tmp_path, "adapter.type=qlora", "model.dtype=bf16")
    assert "bitsandbytes" in str(err) and err.problems[0].key == "adapter.type"
    assert "recipeforge[qlora]" in err.problems[0].hint


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_8bit_optimizer_without_bitsandbytes(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path), tmp_path, "train.optimizer=adamw_8bit")
    assert "bitsandbytes" in str(err) and err.problems[0].key == "train.optimizer"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_without_the_package(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path), tmp_path, "logging.wandb.project=p", "logging.wandb.mode=offline")
    assert "wandb" in str(err) and "recipeforge[wandb]" in err.problems[0].hint


def test_flash_attention_on_cpu(tmp_path):
    _rows(tmp_path, GOOD)
    err = _train(_recipe(tmp_path), tmp_path, "model.attn_implementation=flash_attention_2")
    assert "flash_attention_2" in str(err) and err.problems[0].key == "model.attn_implementation"


def test_unknown_reward_lists_the_available_ones(tiny, tmp_path):
    from recipeforge.run import train

    loaded = tiny.load("grpo", tmp_path / "run", "grpo.rewards=[{name: lenght, args: {target: 3}}]")
    with pytest.raises(RecipeError) as info:
        train(loaded, overwrite=True)
    (problem,) = info.value.problems
    assert problem.message == "unknown reward 'lenght'" and problem.key == "grpo.rewards[0].name"
    assert "did you mean 'length'?" in problem.hint
    assert all(n in problem.hint for n in ("exact_match", "regex", "length", "reward_model"))
    assert problem.location is not None and problem.location.file == "<cli>" or problem.location.file.startswith("<")


def test_reward_against_a_missing_column(tiny, tmp_path):
    from recipeforge.run import train

    loaded = tiny.load("grpo", tmp_path / "run", "grpo.rewards=[{name: exact_match, args: {column: solution}}]")
    with pytest.raises(RecipeError, match="columns found: answer"):
        train(loaded, overwrite=True)
