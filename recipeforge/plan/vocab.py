"""The plan's record of the tokens a recipe adds to the vocabulary (config only: no tokenizer loaded)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.components.vocab import requested_tokens
from recipeforge.plan.types import Choice

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe


def vocab_choice(recipe: Recipe) -> Choice | None:
    """How many tokens the recipe may add and how their embedding rows train; None when it adds none.

    The count is an upper bound: tokens the tokenizer already has are not added (the run's log says
    how many were)."""
    req = requested_tokens(recipe)
    if not req.explicit and not req.template:
        return None
    parts = []
    if req.explicit:
        parts.append(f"{len(req.explicit)} from model.special_tokens/tokens/eot_tokens")
    if req.template:
        parts.append(f"{len(req.template)} of chat template {recipe.data.chat_template}")
    if recipe.adapter.type == "none":
        how = "trained with the other weights"
    else:
        how = ("trained next to the adapters (peft trainable_token_indices on the input embeddings, and on the "
               "output layer when it is not tied to them; a module in adapter.modules_to_save trains in full)")
    total = len(req.explicit) + len(req.template)
    return Choice(total, f"up to {total} tokens ({' + '.join(parts)}) are added where the tokenizer lacks them; "
                         f"each new embedding row starts at the mean of the existing rows and is {how}")
