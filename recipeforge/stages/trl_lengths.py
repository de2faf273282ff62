"""Token-length limits for TRL trainer configs, set explicitly from the recipe.

TRL's configs have length fields with defaults of their own, and which fields exist changes between
releases (older ones also cut every prompt to `max_prompt_length=512` tokens unless told otherwise).
A recipe never relies on those defaults: every limit a config has is set from the recipe, and a
limit the recipe leaves open is set to None (no cut), so the same recipe trains on the same tokens
whatever the installed TRL.
"""

from __future__ import annotations

import dataclasses


def length_arguments(config_cls: type, **limits: int | None) -> dict[str, int | None]:
    """The subset of `limits` (field name -> tokens, None for no limit) that `config_cls` has.

    Raises when none of the given fields exists: a TRL release that renamed all of them would
    otherwise fall back to its own defaults without a word.
    """
    fields = {f.name for f in dataclasses.fields(config_cls)}
    out = {name: value for name, value in limits.items() if name in fields}
    if limits and not out:
        raise RuntimeError(f"{config_cls.__name__} has none of the length fields {sorted(limits)}; "
                           "this TRL release is not supported")
    return out
