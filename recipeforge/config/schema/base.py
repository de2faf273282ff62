"""The base class of every recipe section: strict, immutable, documented."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A recipe section: unknown keys are errors, instances are frozen, every field is documented."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              use_attribute_docstrings=False, protected_namespaces=())
