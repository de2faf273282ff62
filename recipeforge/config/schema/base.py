"""The base class of every recipe section: strict, immutable, documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A recipe section: unknown keys are errors, instances are frozen, every field is documented."""

    # allow_inf_nan=False: `1e999` or "nan" is never a usable number in a recipe.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False,
                              use_attribute_docstrings=False, protected_namespaces=())
