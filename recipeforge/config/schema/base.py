"""The base class of every recipe section: strict, immutable, documented."""

from __future__ import annotations

import types
from typing import Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


class Section(BaseModel):
    """A recipe section: unknown keys are errors, instances are frozen, every field is documented."""

    # allow_inf_nan=False: `1e999` or "nan" is never a usable number in a recipe.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False,
                              use_attribute_docstrings=False, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_are_defaults(cls, data: object) -> object:
        # `train:` with every line below it commented out is YAML null; for a section (or a mapping or
        # list with a default) that means "all defaults", as an empty mapping does. Scalars keep null,
        # so an unfinished `learning_rate:` is still reported.
        if not isinstance(data, dict) or None not in data.values():
            return data
        empty = [name for name, value in data.items() if value is None and _defaults_to_container(cls, name)]
        return {**data, **{name: cls.model_fields[name].default_factory() for name in empty}} if empty else data


def _defaults_to_container(cls: type[BaseModel], name: object) -> bool:
    field = cls.model_fields.get(name) if isinstance(name, str) else None
    if field is None or field.default_factory is None:
        return False
    annotation = field.annotation
    optional = get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)
    return not optional
