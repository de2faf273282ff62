"""${...} interpolation and ??? required values."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL


def test_references_and_env(write):
    path = write("r.yaml", MINIMAL + "name: demo\noutput: {dir: 'runs/${name}-${env:RF_TEST_SUFFIX,x}'}\n"
                 "train: {global_batch_size: 16, micro_batch_size: '${train.global_batch_size}'}\n")
    loaded = load_recipe(path, environ={})
    assert loaded.recipe.output.dir == "runs/demo-x"
    assert loaded.recipe.train.micro_batch_size == 16  # whole-value interpolation keeps the type


def test_env_reads_are_recorded(write, monkeypatch):
    monkeypatch.setenv("RF_TOKEN_FOR_TEST", "s3cret")
    path = write("r.yaml", MINIMAL + "output: {dir: '${env:RF_TOKEN_FOR_TEST}'}\n")
    loaded = load_recipe(path)
    assert loaded.recipe.output.dir == "s3cret"
    assert loaded.env_refs == {("output", "dir"): ["RF_TOKEN_FOR_TEST"]}


def test_required_and_broken_values_are_all_reported_with_other_errors(write, monkeypatch):
    monkeypatch.delenv("RF_UNSET_VAR", raising=False)
    path = write("r.yaml", MINIMAL + "output:\n  dir: ???\n  save_steps: ${train.nope}\n"
                 "name: ${env:RF_UNSET_VAR}\nadapter: {r: 0}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(path)
    by_key = {p.key: p for p in exc.value.problems}
    assert set(by_key) == {"output.dir", "output.save_steps", "name", "adapter.r"}
    assert by_key["output.dir"].message == "required value is missing (???)"
    assert by_key["output.dir"].location.line == 8
    assert "train.nope" in by_key["output.save_steps"].message
    assert "RF_UNSET_VAR is not set" in by_key["name"].message


def test_required_value_given_on_cli(write):
    path = write("r.yaml", MINIMAL + "output:\n  dir: ???\n")
    assert load_recipe(path, ["output.dir=/tmp/run"]).recipe.output.dir == "/tmp/run"
