"""recipeforge-example: each of its components is registered through its entry point and works.

Needs the plugin installed (``pip install plugins/recipeforge-example``). Training a recipe that uses
all of them is tested in recipeforge's own suite (tests/integration/test_plugins_example.py).
"""

from __future__ import annotations

import json

import pytest

from recipeforge.components.formats import RenderOptions, formats
from recipeforge.components.models import models
from recipeforge.components.rewards import RewardContext, build_rewards, rewards
from recipeforge.config import load_recipe
from recipeforge.config.schema import RewardSpec
from recipeforge.errors import RecipeError


def _recipe(tmp_path, extra: str = "") -> str:
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "Which sound does a cat make?", "answer": "meow"}) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("extends: pkg://example/grpo-qa.yaml\nhardware: {gpus_per_node: 0}\n"
                    "data:\n  datasets: [{path: qa.jsonl, format: qa}]\n" + extra)
    return str(path)


def test_every_component_comes_from_the_distribution():
    for registry, name in ((rewards, "word_overlap"), (formats, "qa"), (models, "example/tiny-wide")):
        entry = registry.entry(name)
        assert (entry.source, entry.version) == ("recipeforge-example", "0.1.0"), name


def test_word_overlap_scores_the_share_of_reference_words():
    built = build_rewards([RewardSpec(name="word_overlap", args={"column": "answer"})],
                          RewardContext(columns=("answer",)))
    (reward,) = built.funcs
    got = reward(["q"] * 4, ["The cat says Meow", "meow woof", "nothing", "a b"], answer=["meow", "woof baa", "x", ""])
    assert got == [1.0, 0.5, 0.0, 0.0]
    assert built.names == ["word_overlap"]


def test_word_overlap_checks_its_column():
    with pytest.raises(RecipeError, match="columns found: prompt, solution"):
        build_rewards([RewardSpec(name="word_overlap")], RewardContext(columns=("prompt", "solution")))


def test_qa_rows_become_prompts():
    row = {"question": " Which sound does a cat make? ", "answer": "meow", "context": "Cats purr."}
    out = formats.get("qa").render(row, RenderOptions(tokenizer=None))
    assert out["prompt"] == "Cats purr.\nQuestion: Which sound does a cat make?\nAnswer:" and out["answer"] == "meow"


def test_the_base_recipe_composes_and_validates(tmp_path):
    recipe = load_recipe(_recipe(tmp_path)).recipe
    assert recipe.model.name_or_path == "example/tiny-wide" and recipe.model.tokenizer == "tiny:llama"
    assert recipe.grpo.rewards[0].name == "word_overlap" and recipe.data.datasets[0].format == "qa"


def test_reward_arguments_are_validated_where_they_are_written(tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tmp_path, "grpo:\n  rewards: [{name: word_overlap, args: {colum: answer, min_word_length: 0}}]\n"))
    ps = {p.key: p for p in info.value.problems}
    assert ps["grpo.rewards[0].args.colum"].hint == "did you mean 'column'?"
    assert ps["grpo.rewards[0].args.min_word_length"].message == "must be >= 1 (got 0)"
    assert ps["grpo.rewards[0].args.colum"].location.line == 6


def test_the_planner_sizes_the_model_like_transformers_builds_it(tmp_path):
    import torch

    from recipeforge.components.models import load_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer
    from recipeforge.plan.catalog import resolve_model

    spec, source = resolve_model("example/tiny-wide")
    assert source == "plugin recipeforge-example 0.1.0"
    model = load_model("example/tiny-wide", build_tiny_tokenizer(1024), device="cpu", dtype="fp32")
    assert spec.total_params() == sum(p.numel() for p in model.parameters())
    assert model.dtype == torch.float32 and model.config._name_or_path == "example/tiny-wide"
