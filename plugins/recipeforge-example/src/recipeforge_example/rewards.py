"""The ``word_overlap`` reward: the share of the reference answer's words a completion contains.

A reward is a *factory* ``factory(args, ctx) -> reward function``. Declaring ``args_model`` (a
pydantic model) makes recipeforge check the recipe's ``args:`` when the recipe loads, with located
errors (``recipe.yaml:14:9 grpo.rewards[0].args.colum: unknown key 'colum'``), and hand the factory
the validated values with their defaults.
"""

from __future__ import annotations

import re

from pydantic import Field

from recipeforge.components.rewards import RewardContext, completion_text
from recipeforge.config.schema.base import Section
from recipeforge.errors import RecipeError

_WORD = re.compile(r"\w+")


class WordOverlapArgs(Section):
    """Arguments of ``word_overlap`` (unknown keys are errors, like everywhere in a recipe)."""

    column: str = Field("answer", min_length=1, description="Dataset column holding the reference answer.")
    ignore_case: bool = Field(True, description="Compare words case-insensitively.")
    min_word_length: int = Field(1, ge=1, description="Ignore reference words shorter than this.")


def _words(text: str, ignore_case: bool, min_length: int) -> set[str]:
    words = _WORD.findall(text.lower() if ignore_case else text)
    return {w for w in words if len(w) >= min_length}


def word_overlap(args: dict, ctx: RewardContext):
    """1.0 when every word of the row's reference answer appears in the completion; partial credit
    for some of them; 0.0 for none (or an empty reference)."""
    a = WordOverlapArgs.model_validate(args)
    # Checked when the trainer is built: the data is loaded by then, the model not yet.
    if ctx.columns and a.column not in ctx.columns:
        raise RecipeError(f"reward 'word_overlap' reads column '{a.column}', which the data does not have; "
                          f"columns found: {', '.join(ctx.columns)}", hint="set args.column")

    def reward(prompts, completions, **columns):
        out = []
        for completion, reference in zip(completions, columns[a.column]):
            wanted = _words(str(reference), a.ignore_case, a.min_word_length)
            got = _words(completion_text(completion), a.ignore_case, 1)
            out.append(len(wanted & got) / len(wanted) if wanted else 0.0)
        return out

    return reward


word_overlap.args_model = WordOverlapArgs
