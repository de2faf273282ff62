"""Multi-turn GRPO with the calculator environment on the tiny model: after a short SFT on the tool-call
layout, GRPO's episodes call the calculator, the mean reward rises, and the tool results the environment
returned carry label -100 (read from the run's logs/episodes.jsonl, token by token)."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from recipeforge.components.environments import CalculatorEnvironment

pytestmark = pytest.mark.slow


def test_calculator_episodes_raise_the_reward_and_tool_results_are_not_trained(tiny, tmp_path):
    from transformers import AutoTokenizer

    tools = tiny.recipes.parents[1] / "tools"  # examples/tools
    # A shorter warm start than the example's 80 steps: the model calls the tool about half the time
    # (reward ~0.5 at GRPO's first steps), so GRPO has room to raise it; after 80 steps it starts near 0.9.
    sft = tiny.train(str(tools / "sft.yaml"), tmp_path / "sft", "train.max_steps=60")
    run = tiny.train(str(tools / "grpo.yaml"), tmp_path / "grpo", f"model.name_or_path={sft / 'final'}")
    reward, calls = tiny.values(run, "reward"), tiny.values(run, "tools/call_frequency")
    assert len(reward) == 12 and len(calls) == 12
    assert statistics.fmean(reward[-4:]) > statistics.fmean(reward[:4]) + 0.1, reward
    assert "rewards/CalculatorEnvironment/mean" in tiny.records(run, "train")[-1]

    episodes = [json.loads(line) for line in (run / "logs" / "episodes.jsonl").read_text().splitlines()]
    answered = [e for e in episodes if e["tool_calls"]]
    assert len(answered) >= len(episodes) // 2, [e["completion"] for e in episodes]
    tok = AutoTokenizer.from_pretrained(sft / "final")
    for e in answered:
        ids, labels, tool_mask = e["completion_ids"], e["labels"], e["tool_mask"]
        # The episode without its padding (untrained pad tokens at the end); an episode may end with the tool
        # turn itself, when the call was its last allowed turn.
        real_end = len(ids)
        while real_end and ids[real_end - 1] == tok.pad_token_id and labels[real_end - 1] == -100:
            real_end -= 1
        result = [i for i, m in enumerate(tool_mask[:real_end]) if m == 0]
        assert result and all(labels[i] == -100 for i in result)
        # The masked tokens are exactly the tool turn: the calculator's value of the call's expression.
        expression = re.search(r'"expression": "([^"]*)"', e["completion"]).group(1)
        value = CalculatorEnvironment().calculate(expression)
        assert tok.decode([ids[i] for i in result]) == f"\n<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n"
        # Everything the model wrote keeps its label: the call before the result, the reply after it.
        written = [i for i in range(real_end) if tool_mask[i] == 1]
        assert written and all(labels[i] == ids[i] for i in written)
        assert "<tool_call>" in tok.decode([ids[i] for i in written if i < result[0]])
