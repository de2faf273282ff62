"""`extends:` composition."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.compose import compose_file
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL


def test_parents_merge_in_order_and_the_file_wins(write):
    write("a.yaml", "train: {seed: 1, learning_rate: 0.1}\nadapter: {type: lora, r: 4}\n")
    write("b.yaml", "train: {seed: 2}\n")
    child = write("c.yaml", "extends: [a.yaml, b.yaml]\n" + MINIMAL + "adapter: {r: 8}\n")
    tree = compose_file(child)
    assert tree.data["train"] == {"seed": 2, "learning_rate": 0.1}
    assert tree.data["adapter"] == {"type": "lora", "r": 8}
    assert "extends" not in tree.data
    # provenance: each key points at the file that wrote it
    assert tree.prov[("train", "learning_rate")].file.endswith("a.yaml")
    assert tree.prov[("train", "seed")].file.endswith("b.yaml")
    assert tree.prov[("adapter", "r")].file.endswith("c.yaml")


def test_lists_are_replaced_not_concatenated(write):
    write("base.yaml", MINIMAL)
    child = write("c.yaml", "extends: base.yaml\ndata:\n  datasets:\n    - {path: other.jsonl, format: messages}\n")
    recipe = load_recipe(child).recipe
    assert [d.path for d in recipe.data.datasets] == ["other.jsonl"]


def test_paths_are_relative_to_the_recipe_that_names_them(write):
    write("bases/root.yaml", MINIMAL)
    write("bases/mid.yaml", "extends: root.yaml\ntrain: {seed: 7}\n")
    child = write("recipes/x.yaml", "extends: ../bases/mid.yaml\n")
    assert load_recipe(child).recipe.train.seed == 7


def test_missing_parent_points_at_the_extends_entry(write):
    child = write("c.yaml", "stage: sft\nextends:\n  - nope.yaml\n")
    with pytest.raises(RecipeError) as exc:
        compose_file(child)
    p = exc.value.problems[0]
    assert "extended recipe not found" in p.message
    assert p.location.file.endswith("c.yaml") and p.location.line == 3 and p.key == "extends"


def test_cycle_is_reported_with_the_chain(write):
    write("a.yaml", "extends: b.yaml\n")
    write("b.yaml", "extends: a.yaml\n")
    with pytest.raises(RecipeError) as exc:
        compose_file(write("c.yaml", "extends: a.yaml\n"))
    p = exc.value.problems[0]
    assert "extends cycle: c.yaml -> a.yaml -> b.yaml -> a.yaml" in p.message
    assert p.location.file.endswith("b.yaml") and p.location.line == 1


def test_error_in_parent_points_into_the_parent(write):
    write("base.yaml", MINIMAL + "train:\n  learning_rate: -1\n")
    child = write("c.yaml", "extends: base.yaml\nname: x\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(child)
    p = exc.value.problems[0]
    assert p.key == "train.learning_rate" and p.location.file.endswith("base.yaml") and p.location.line == 8


def test_extends_must_be_paths(write):
    with pytest.raises(RecipeError, match="extends must be a path or a list of paths"):
        compose_file(write("c.yaml", "extends: {a: 1}\n"))


def test_unknown_plugin_recipe(write):
    with pytest.raises(RecipeError, match="no installed plugin ships recipes under 'nope'"):
        compose_file(write("c.yaml", "extends: pkg://nope/base.yaml\n"))


def test_a_text_not_saved_yet_reads_as_the_file_it_edits(write):
    write("base.yaml", "train: {seed: 1, learning_rate: 0.1}\n")
    child = write("c.yaml", "extends: base.yaml\n" + MINIMAL)
    edited = "extends: base.yaml\n" + MINIMAL + "train: {seed: 7}\n"
    loaded = load_recipe(child, text=edited)
    assert loaded.recipe.train.seed == 7 and loaded.recipe.train.learning_rate == 0.1  # the parent, beside the file
    assert compose_file(child).data["train"] == {"seed": 1, "learning_rate": 0.1}  # the file itself is unchanged
    with pytest.raises(RecipeError) as err:
        load_recipe(child, text=edited.replace("seed: 7", "seed: many"))
    problem = err.value.problems[0]
    assert problem.location.file.endswith("c.yaml") and problem.location.line == edited.count("\n")
