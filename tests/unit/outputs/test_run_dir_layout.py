"""The run directory: default location, overwrite/resume rules, model card (the descriptive files and the
environment record, which asks `git` for the commit: tests/commands/test_run_dir_layout.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.outputs.run_dir import RunDir, default_run_dir, prepare
from recipeforge.tools.model_card import render_model_card

TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def test_default_run_dir_is_runs_slash_recipe_stem():
    loaded = load_recipe(TINY / "dpo.yaml")
    assert default_run_dir(loaded.recipe, loaded.path) == Path("runs") / "dpo"
    loaded = load_recipe(TINY / "dpo.yaml", overrides=["output.dir=/x/y"])
    assert default_run_dir(loaded.recipe, loaded.path) == Path("/x/y")


def test_prepare_rules(tmp_path):
    run = RunDir(tmp_path / "run")
    prepare(run, overwrite=False, resume="never")
    assert run.root.is_dir()
    (run.final).mkdir()
    with pytest.raises(RecipeError, match="resume is 'never'"):
        prepare(run, overwrite=False, resume="never")
    prepare(run, overwrite=False, resume="auto")  # continuing is fine
    assert run.final.exists()
    prepare(run, overwrite=True, resume="never")
    assert run.root.is_dir() and not run.final.exists()


def test_model_card_embeds_the_recipe(tmp_path):
    from recipeforge.plan import make_plan

    loaded = load_recipe(TINY / "sft-lora.yaml")
    (tmp_path / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 6.9}\n'
                                            '{"split": "train", "step": 40, "loss": 1.2}\n')
    card = render_model_card(recipe=loaded.recipe, recipe_data=loaded.tree.data, plan=make_plan(loaded.recipe),
                             data_stats={"train_rows": 67}, run_dir=tmp_path, adapter=True)
    assert card.startswith("---\nlibrary_name: peft")
    assert "| train loss | 6.9 | 1.2 |" in card
    assert "| train_rows | 67 |" in card
    embedded = card.split("```yaml\n")[1].split("```")[0]
    assert yaml.safe_load(embedded) == yaml.safe_load(yaml.safe_dump(loaded.tree.data))
