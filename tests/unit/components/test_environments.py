"""Tool environments: the calculator's arithmetic whitelist, its episodes and rewards, the factory's checks,
the tool-call format check of the chat template, and the labels of a tool episode."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.components.environments import (
    CalculatorEnvironment, environment_factory, evaluate_arithmetic, get_environment_class, has_reward,
)
from recipeforge.config.schema.stages import EnvironmentSpec
from recipeforge.errors import RecipeError
from recipeforge.stages.tool_episodes import IGNORE, episode_labels, response_format

ROOT = Path(__file__).resolve().parents[3]


def test_arithmetic_is_evaluated():
    assert evaluate_arithmetic("12 * (3 + 4)") == 84
    assert evaluate_arithmetic("-2 ** 3 + 7 // 2 % 5") == -5
    assert evaluate_arithmetic("1 / 4") == 0.25


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "x + 1", "(1).real", "[1, 2]", "1 if 1 else 2", "2 ** 100", "10 ** 10 ** 10",
    "1 / 0", "'a' * 3", "f'{1}'", "1 +", "9" * 300, "lambda: 1",
])
def test_anything_but_arithmetic_is_refused(expression):
    with pytest.raises(ValueError):
        evaluate_arithmetic(expression)


def test_a_calculator_episode_is_scored_from_its_calls():
    env = CalculatorEnvironment()
    env.reset(prompt=[{"role": "user", "content": "What is 3 + 4?"}], answer="7")
    assert env.get_reward() == 0.0  # no call yet
    assert env.calculate("3 + 4") == "7"
    assert env.get_reward() == 2.0  # a successful call that returned the answer
    env.reset(answer="7")
    assert env.calculate("2 * 3") == "6" and env.get_reward() == 1.0
    assert env.calculate("os.getcwd()").startswith("error:") and env.get_reward() == 0.0
    env.reset(answer="1")
    assert env.results == [] and env.failures == 0


def test_the_factory_checks_names_args_and_code_trust():
    factory = environment_factory(EnvironmentSpec(name="calculator", args={"answer_weight": 0.5}), allow_code=False)
    assert isinstance(factory(), CalculatorEnvironment) and factory() is not factory() and has_reward(factory)
    with pytest.raises(RecipeError, match="takes no argument 'weight'") as exc:
        environment_factory(EnvironmentSpec(name="calculator", args={"weight": 1}), allow_code=False)
    assert exc.value.problems[0].key == "grpo.environment.args"
    with pytest.raises(RecipeError, match="unknown environment"):
        get_environment_class("calculater", allow_code=False)
    with pytest.raises(RecipeError, match="opt-in"):
        get_environment_class("collections:OrderedDict", allow_code=False)
    with pytest.raises(RecipeError, match="not a class with a reset method"):
        get_environment_class("collections:OrderedDict", allow_code=True)


def _tokenizer(template: str):
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(1024)
    tok.chat_template = template
    return tok


def test_the_tools_template_gets_a_tool_call_parser():
    tok = _tokenizer((ROOT / "examples" / "tools" / "tools.jinja").read_text())
    response_format(tok)
    prefix = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                     add_generation_prompt=True)
    text = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n'
            '</tool_call><|im_end|>')
    parsed = tok.parse_response(text, prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "calculate", "arguments": {"expression": "2 + 3"}}


def test_a_template_without_tool_calls_is_refused_at_its_key():
    from recipeforge.components.chat_templates import TEMPLATES

    with pytest.raises(RecipeError, match="does not write tool calls") as exc:
        response_format(_tokenizer(TEMPLATES["chatml"].text))
    assert exc.value.problems[0].key == "data.chat_template"


def test_tool_results_and_padding_carry_no_label():
    ids = [5, 6, 7, 8, 9, 0]
    assert episode_labels(ids, [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 1, 1]) == [5, 6, IGNORE, IGNORE, 9, IGNORE]
    assert episode_labels(ids, [1, 1, 1, 1, 1, 0], None) == [5, 6, 7, 8, 9, IGNORE]


def test_tool_turns_count_the_answered_calls():
    from recipeforge.stages.tool_episodes import tool_turns

    assert tool_turns([1, 0, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 0]) == 2
    assert tool_turns([1, 1, 1], [1, 1, 0]) == 0 and tool_turns(None, [1]) == 0
