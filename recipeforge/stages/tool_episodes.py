"""Multi-turn GRPO episodes with a tool environment, on TRL's own tool loop (`GRPOTrainer(environment_factory=...)`).

recipeforge checks what TRL assumes, as recipe errors before the model loads: the prompts are
conversations, the chat template writes tool calls and their results, and the template's tool-call
format can be parsed (`response_format`). During training, `record_episodes` writes each generation
batch's episodes to ``logs/episodes.jsonl``: the completion as the model saw it (tool calls and tool
results included), and its labels, the completion's token ids with -100 wherever the loss does not
reach (tool-result tokens and padding), which is the mask TRL's loss multiplies by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from recipeforge.errors import Location, RecipeError

IGNORE = -100
EPISODES_LOGGED = 4  # episodes per generation batch written to episodes.jsonl


def check_conversational(rows: Any, *, location: Location | None = None) -> None:
    """Tool episodes need conversational prompts (a list of messages): the tools are rendered into them."""
    if len(rows) and not isinstance(rows[0]["prompt"], list):
        raise RecipeError("grpo.environment needs conversational prompts (a list of messages in the prompt "
                          "column); this dataset's prompts are plain text", key="grpo.environment",
                          location=location,
                          hint='write prompts as [{"role": "user", "content": "..."}] (format: prompt)')


def response_format(tokenizer: Any, *, location: Location | None = None) -> None:
    """Make sure TRL can render tool calls with the tokenizer's chat template and parse them back from a
    completion: TRL's own parser for the templates it knows, the Hermes/Qwen ``<tool_call>`` JSON parser
    for a ChatML template that writes that format; anything else is a recipe error."""
    from trl.chat_template_utils import add_response_schema, qwen3_template, supports_tool_calling

    hint = ("use a chat template that writes an assistant's tool_calls and tool results, e.g. the model's own "
            "(data.chat_template: tokenizer) or a .jinja file writing <tool_call>{json}</tool_call> in ChatML")
    if not supports_tool_calling(tokenizer):
        raise RecipeError("the chat template does not write tool calls and tool results, so the environment's "
                          "tools cannot be used", key="data.chat_template", location=location, hint=hint)
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return
    try:
        add_response_schema(tokenizer)
        return
    except ValueError:
        pass
    template = str(tokenizer.chat_template)
    if "<tool_call>" in template and "<|im_start|>" in template:
        tokenizer.response_template = qwen3_template
        return
    raise RecipeError("the chat template's tool-call format is not one recipeforge or TRL can parse",
                      key="data.chat_template", location=location, hint=hint)


def episode_labels(completion_ids: list[int], completion_mask: list[int], tool_mask: list[int] | None) -> list[int]:
    """A completion's labels: its ids where the loss applies, -100 on tool results and padding."""
    mask = completion_mask if tool_mask is None else [a * b for a, b in zip(completion_mask, tool_mask)]
    return [t if m else IGNORE for t, m in zip(completion_ids, mask)]


def tool_turns(tool_mask: list[int] | None, completion_mask: list[int]) -> int:
    """Tool results inside a completion (runs of tool-mask 0 among its real tokens): the calls the
    environment answered."""
    if tool_mask is None:
        return 0
    turns, inside = 0, False
    for tool, real in zip(tool_mask, completion_mask):
        result = real and not tool
        turns += result and not inside
        inside = bool(result)
    return turns


def record_episodes(trainer: Any, path: Path, *, is_main: bool = True) -> None:
    """Write the first episodes of every generation batch of `trainer` to `path` (JSON lines)."""
    original: Callable[..., dict[str, Any]] = trainer._generate_and_score_completions
    tokenizer = trainer.processing_class

    def generate_and_score(inputs: Any) -> dict[str, Any]:
        out = original(inputs)
        if is_main:
            rows = []
            ids, cmask = out["completion_ids"].tolist(), out["completion_mask"].tolist()
            tmask = out["tool_mask"].tolist() if "tool_mask" in out else None
            for i in range(min(EPISODES_LOGGED, len(ids))):
                labels = episode_labels(ids[i], cmask[i], None if tmask is None else tmask[i])
                text = tokenizer.decode([t for t, m in zip(ids[i], cmask[i]) if m])
                tool = None if tmask is None else tmask[i][:len(ids[i])]
                rows.append({"step": int(trainer.state.global_step), "completion": text,
                             "tool_calls": tool_turns(tool, cmask[i]),
                             "completion_ids": ids[i], "labels": labels,
                             "tool_mask": tool,
                             "advantage": float(out["advantages"][i])})
            with path.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
        return out

    trainer._generate_and_score_completions = generate_and_score
