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


def _check(text: str | bytes, overrides: list[str] | None = None, environ: dict | None = None) -> None:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        try:
            loaded = load_recipe(path, overrides or [], environ=environ or {})
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


# -- hostile structure: what a careless or malicious recipe, override or variable can hold
def _nested(depth: int, kind: str) -> str:
    if kind == "flow-list":
        return "[" * depth + "1" + "]" * depth
    if kind == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    return "[{a: " * (depth // 2) + "1" + "}]" * (depth // 2)


deep_values = st.builds(_nested, st.integers(1, 400), st.sampled_from(["flow-list", "flow-map", "mixed"]))
alias_values = st.sampled_from([
    "&a [*a]", "&a {x: *a}", "&a [[1, [*a]]]", "&a {<<: *a}", "&a [1, 2]", "*undefined", "&a {x: 1}",
    "&a [&b [*b]]", "&a [&b [*a]]", "[&a [1], *a, *a]",
])
huge_numbers = st.one_of(
    st.integers(2**63 - 2, 2**63 + 2).map(str),
    st.integers(20, 6000).map(lambda n: "9" * n),
    st.integers(20, 6000).map(lambda n: "-" + "1" * n),
    st.integers(300, 100000).map(lambda e: f"1.0e+{e}"),
    st.integers(300, 100000).map(lambda e: f"1e{e}"),
    st.sampled_from(["0x" + "f" * 40, "0b" + "1" * 100, "0o" + "7" * 40]),
)
non_finite = st.sampled_from([".nan", ".NaN", ".inf", "-.inf", "+.Inf", "nan", "inf", "-Infinity", "'nan'"])
odd_text = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F), min_size=1, max_size=5),
    st.sampled_from(['"\\ud800"', '"\\udfff x"', "caf\udce9", "\x1b[31m", "\ufeffx", "a\u202eb"]),
)
hostile_values = st.one_of(deep_values, alias_values, huge_numbers, non_finite, odd_text,
                           st.sampled_from(["${name}", "${.x}", "${oc.env:HOME}", "${env:${x}}", "${" * 50,
                                            "${train.seed}" * 500]))
KEYS = ["name", "description", "train.seed", "train.max_steps", "train.learning_rate", "train.weight_decay",
        "adapter.dropout", "data.sequence_len", "model.name_or_path", "kernels.liger", "hardware.cpu_ram_gb"]


@st.composite
def hostile_files(draw):
    """A seed recipe with one key set to a hostile YAML value, written into the file."""
    key = draw(st.sampled_from(KEYS)).split(".")
    rest = {k: v for k, v in draw(st.sampled_from(SEEDS)).items() if k != key[0]}
    block = "".join("  " * i + f"{k}:\n" for i, k in enumerate(key[:-1])) + "  " * (len(key) - 1) + \
        f"{key[-1]}: {draw(hostile_values)}\n"
    return yaml.safe_dump(rest, sort_keys=False) + block


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_files())
def test_hostile_file_values_only_raise_recipe_errors(text):
    _check(text)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KEYS), hostile_values)
def test_hostile_overrides_only_raise_recipe_errors(key, value):
    _check(yaml.safe_dump(SEEDS[0]), [f"{key}={value}"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(KEYS), hostile_values)
def test_hostile_environment_only_raises_recipe_errors(key, value):
    name = "RECIPEFORGE_" + key.upper().replace(".", "__")
    _check(yaml.safe_dump(SEEDS[0]), environ={name: value})


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 400))
def test_non_utf8_bytes_only_raise_recipe_errors(junk, where):
    text = yaml.safe_dump(SEEDS[1]).encode()
    where = min(where, len(text))
    _check(text[:where] + junk + text[where:])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 1500), st.sampled_from(["map", "list"]))
def test_deep_block_nesting_only_raises_recipe_errors(depth, kind):
    step = "k:\n" if kind == "map" else "-\n"
    _check("stage: sft\nname:\n" + "".join("  " * (i + 1) + step for i in range(depth)) + "  " * (depth + 1) + "1\n")
