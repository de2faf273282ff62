"""A reward given as Python code (``module:function``) next to the recipe: refused without the
opt-in, with the hint; trained with it (the recipe's allow_code, or RECIPEFORGE_TRUST_CODE=1)."""

from __future__ import annotations

import pytest

from recipeforge.errors import RecipeError
from recipeforge.registry import TRUST_ENV

pytestmark = pytest.mark.slow

REWARD = '''\
def quarter(prompts, completions, scale=1.0, **columns):
    """A constant reward the test can recognise in the logs; `answer` proves the columns arrive."""
    assert len(columns["answer"]) == len(completions)
    return [0.25 * scale for _ in completions]
'''


def _recipe(tiny, tmp_path, extra: str = "", module: str = "team_rewards"):
    # A module name per test: Python caches imported modules for the whole session.
    (tmp_path / f"{module}.py").write_text(REWARD)
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""\
extends: {tiny.recipes / 'grpo.yaml'}
grpo:
  rewards:
    - name: {module}:quarter
      args: {{scale: 2.0}}
train: {{max_steps: 2, logging_steps: 1}}
{extra}""")
    return path


def test_code_reward_needs_the_opt_in(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(RecipeError) as info:
        tiny.load(_recipe(tiny, tmp_path), tmp_path / "run")
    (p,) = info.value.problems
    assert p.key == "grpo.rewards[0].name" and p.location.line == 4 and "allow_code: true" in p.hint


@pytest.mark.parametrize("opt_in", ["recipe", "environment"])
def test_code_reward_trains_with_the_opt_in(tiny, tmp_path, monkeypatch, opt_in):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    if opt_in == "environment":
        monkeypatch.setenv(TRUST_ENV, "1")
    path = _recipe(tiny, tmp_path, "allow_code: true\n" if opt_in == "recipe" else "", module=f"team_rewards_{opt_in}")
    run = tiny.train(str(path), tmp_path / "run")
    assert tiny.values(run, "rewards/quarter/mean") == [0.5, 0.5]  # our function ran, with its args
