"""The ``qa`` dataset format: rows with a question (and an answer for the rewards) become GRPO prompts.

A format is a `recipeforge.components.formats.Format`: its kind (``lm`` for pretrain/SFT token
segments, ``preference`` for DPO, ``prompt`` for GRPO), the columns it needs, and a function that
renders one row. recipeforge checks at load time that the recipe's stage can train on the kind.
"""

from __future__ import annotations

from recipeforge.components.formats import Format, RenderOptions


def render_qa(row: dict, opts: RenderOptions) -> dict:
    """``{"question": "Which sound does a cat make?", "answer": "meow"}`` -> a prompt ending in
    "Answer:"; every other column (the answer) stays in the row for the reward functions."""
    context = f"{row['context'].strip()}\n" if row.get("context") else ""
    return {**row, "prompt": f"{context}Question: {row['question'].strip()}\nAnswer:"}


QA = Format(
    name="qa",
    kind="prompt",
    required=("question", "answer"),
    optional=("context",),
    render=render_qa,
    description="question/answer rows (optional context) as GRPO prompts; the answer reaches the rewards",
)
