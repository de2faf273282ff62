"""Property-based fuzzing of the recipe language: whatever a user writes, recipeforge answers with a
`RecipeError` (or a valid Recipe), never with any other exception."""

from __future__ import annotations

import copy
import os
import tempfile

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipeforge.config import load_recipe
from recipeforge.config.schema import Recipe
from recipeforge.errors import RecipeError

SEEDS = [
    {"stage": "sft", "model": {"name_or_path": "tiny:llama", "dtype": "bf16"},
     "adapter": {"type": "lora", "r": 8, "target_modules": ["q_proj", "v_proj"]},
     "data": {"datasets": [{"path": "a.jsonl", "format": "alpaca", "columns": {"instruction": "q"}}],
              "sequence_len": 512, "val_size": 0.1},
     "train": {"max_steps": 10, "global_batch_size": 8, "micro_batch_size": 2, "learning_rate": 1e-4},
     "output": {"dir": "runs/${stage}", "save_steps": 5}, "kernels": ["liger"]},
    {"stage": "dpo", "model": {"name_or_path": "x"}, "data": {"datasets": [{"path": "p", "format": "preference"}]},
     "dpo": {"beta": 0.2}, "distributed": {"backend": "deepspeed", "zero_stage": 3, "offload": "optimizer"}},
    {"stage": "grpo", "model": {"name_or_path": "x"}, "data": {"datasets": [{"path": "p", "format": "prompt"}]},
     "grpo": {"num_generations": 4, "rewards": [{"name": "length", "args": {"target": 10}}]},
     "train": {"global_batch_size": 8}, "logging": {"wandb": {"project": "p", "mode": "offline"}}},
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["???", "${train.seed}", "${env:NOPE}", "${",
                                                          "${nope.x}", "auto", "lora", "sft", "1e-4"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_recipes(draw):
    data = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["delete", "rename", "retype", "add"]))
        key = path[-1]
        if op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = parent.pop(key)
        elif op == "retype":
            parent[key] = draw(values)
        elif isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return yaml.safe_dump(data, sort_keys=False)


@st.composite
def text_mutations(draw):
    text = yaml.safe_dump(draw(st.sampled_from(SEEDS)), sort_keys=False)
    lines = text.splitlines()
    op = draw(st.sampled_from(["duplicate", "drop", "insert", "truncate", "indent"]))
    i = draw(st.integers(0, len(lines) - 1))
    if op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "drop":
        del lines[i]
    elif op == "insert":
        lines.insert(i, draw(st.text(max_size=30)))
    elif op == "truncate":
        lines = lines[:i] + [lines[i][: draw(st.integers(0, len(lines[i])))]]
    else:
        lines[i] = " " * draw(st.integers(1, 5)) + lines[i]
    return "\n".join(lines) + "\n"


def _check(text: str, overrides: list[str] | None = None) -> None:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
        try:
            loaded = load_recipe(path, overrides or [], environ={})
        except RecipeError as exc:
            assert exc.problems and all(p.message for p in exc.problems)
            exc.render()
        else:
            assert isinstance(loaded.recipe, Recipe)
    finally:
        os.unlink(path)


FUZZ = settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(mutated_recipes())
def test_structural_mutations_only_raise_recipe_errors(text):
    _check(text)


@FUZZ
@given(text_mutations())
def test_text_mutations_only_raise_recipe_errors(text):
    _check(text)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
def test_random_text_only_raises_recipe_errors(text):
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=25), max_size=4))
def test_random_overrides_only_raise_recipe_errors(overrides):
    _check(yaml.safe_dump(SEEDS[0]), overrides)
