"""Built-in GRPO rewards, the rewards registry, and reward errors."""

from __future__ import annotations

import pytest

from recipeforge.components.rewards import (RewardContext, build_rewards, completion_text, exact_match, length,
                                            regex, rewards)
from recipeforge.config.schema import RewardSpec
from recipeforge.errors import RecipeError

CTX = RewardContext(columns=("answer",))


def test_registry_has_the_builtins():
    assert {"exact_match", "regex", "length", "reward_model"} <= set(rewards.names())


def test_exact_match_against_a_column():
    f = exact_match({"column": "answer"}, CTX)
    assert f(["p"] * 3, ["Moo.", "moo moo", [{"role": "assistant", "content": " MOO "}]],
             answer=["moo", "moo", "moo"]) == [1.0, 0.0, 1.0]
    g = exact_match({"column": "answer", "extract": r"answer:\s*(\w+)"}, CTX)
    assert g(["p", "p"], ["so the answer: moo", "no idea"], answer=["moo", "moo"]) == [1.0, 0.0]
    h = exact_match({"column": "answer", "mode": "contains"}, CTX)
    assert h(["p"], ["The cow says moo."], answer=["moo"]) == [1.0]


def test_exact_match_needs_the_column():
    with pytest.raises(RecipeError, match="columns found: answer"):
        exact_match({"column": "solution"}, CTX)


def test_regex_modes():
    assert regex({"pattern": r"\d+"}, CTX)(["p"] * 2, ["it is 42", "none"]) == [1.0, 0.0]
    full = regex({"pattern": r"[a-z ]+\.", "mode": "fullmatch"}, CTX)
    assert full(["p"] * 2, ["the cow says moo.", "The cow!"]) == [1.0, 0.0]
    with pytest.raises(RecipeError, match="invalid regular expression"):
        regex({"pattern": "("}, CTX)
    with pytest.raises(RecipeError, match="needs args.pattern"):
        regex({}, CTX)
    with pytest.raises(RecipeError, match="has no argument 'patern'"):
        regex({"patern": "x"}, CTX)


def test_length_peaks_at_the_target():
    f = length({"target": 4}, CTX)
    assert f(["p"] * 3, ["abcd", "ab", "abcdefgh"]) == [1.0, 0.5, 0.0]
    toks = length({"target": 2, "unit": "tokens"}, RewardContext(tokenizer=type("T", (), {"eos_token_id": 9})()))
    assert toks(["p"], ["x"], completion_ids=[[1, 2, 9]]) == [1.0]
    with pytest.raises(RecipeError, match="must be > 0"):
        length({"target": 0}, CTX)


def test_completion_text_of_both_layouts():
    assert completion_text("x") == "x"
    assert completion_text([{"role": "assistant", "content": "y"}]) == "y"


def test_build_rewards_names_weights_and_errors():
    specs = [RewardSpec(name="length", weight=0.5, args={"target": 3}), RewardSpec(name="length", args={"target": 9}),
             RewardSpec(name="exact_match")]
    built = build_rewards(specs, CTX)
    assert built.names == ["length", "length_2", "exact_match"] and built.weights == [0.5, 1.0, 1.0]
    assert [f.__name__ for f in built.funcs] == built.names  # the names the trainer logs under
    with pytest.raises(RecipeError) as info:
        build_rewards([RewardSpec(name="exact")], CTX)
    (p,) = info.value.problems
    assert p.key == "grpo.rewards[0].name" and "available: accuracy, exact_match, length, regex, reward_model" in p.hint
    with pytest.raises(RecipeError) as info:
        build_rewards([RewardSpec(name="regex")], CTX)
    assert info.value.problems[0].key == "grpo.rewards[0].args"


def test_code_rewards_need_allow_code():
    spec = [RewardSpec(name="os.path:basename")]
    with pytest.raises(RecipeError, match="allow_code"):
        build_rewards(spec, CTX)
    built = build_rewards(spec, RewardContext(allow_code=True))
    assert built.names == ["basename"]


def test_reward_model_path_must_exist(tmp_path):
    with pytest.raises(RecipeError, match="cannot load"):
        build_rewards([RewardSpec(name="reward_model", args={"path": str(tmp_path / "rm")})], CTX)
