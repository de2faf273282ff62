"""`model.special_tokens`, and the token lists beside it: vocabulary changes a recipe asks for."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from recipeforge.config.schema.base import Section

_TOKEN = dict(min_length=1)


class SpecialTokens(Section):
    """Tokenizer special tokens; token settings sit under `model:` as their new embedding rows train with it.

    Each token a recipe adds (`special_tokens`, `tokens`, `eot_tokens`) gets an embedding row, started
    at the mean of the others, trained with the model (under LoRA through peft's
    trainable_token_indices) and saved with it and its tokenizer, for every dataset alike. `recipeforge
    plan` records how many may be added."""

    bos_token: Optional[str] = Field(None, **_TOKEN, description="Beginning-of-sequence token.")
    eos_token: Optional[str] = Field(
        None, **_TOKEN, description="End-of-sequence token: appended to text/completion rows, and generation "
                                    "stops at it.")
    pad_token: Optional[str] = Field(None, **_TOKEN, description="Padding token (never trained).")
    unk_token: Optional[str] = Field(None, **_TOKEN, description="Unknown-token token.")


def check_tokens(value: tuple[str, ...]) -> tuple[str, ...]:
    """Token lists hold distinct, non-empty strings."""
    empty = [i for i, t in enumerate(value) if not t]
    if empty:
        raise ValueError(f"entry {empty[0]} is empty; a token is a non-empty string")
    dupes = sorted({t for t in value if value.count(t) > 1})
    if dupes:
        raise ValueError(f"{', '.join(map(repr, dupes))} listed twice")
    return value
