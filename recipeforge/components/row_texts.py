"""Preference and unpaired rows written as text (`data.datasets[].texts`).

This is the model of Axolotl's DPO and KTO dataset types (`chatml.intel`, `llama3.ultra`, a `type:`
mapping with `prompt_format`, ...): each row's prompt and answers are plain strings made with format
strings over the row's columns, a system text written before the prompt only when the row has one,
and the trainer is handed those strings (so TRL tokenizes them as text, not through the chat template).

A placeholder names a column, ``{question}``, or reads into one holding a list of messages,
``{chosen[1][content]}`` (Python's indexing in format strings; attribute access is refused).

Nothing here imports torch, transformers or datasets at module level.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

from recipeforge.errors import Location, RecipeError

if TYPE_CHECKING:
    from datasets import Dataset

SYSTEM = "system"  # the column whose non-empty text brings in `texts.system`
ANSWERS = {"preference": ("chosen", "rejected"), "unpaired": ("completion",)}


def columns_read(template: str) -> list[str]:
    """The columns a format string reads (the part of each placeholder before any ``[index]``), in order;
    a malformed placeholder is a ValueError."""
    # str.format's own parser of a placeholder: the column, then its [index] parts
    from _string import formatter_field_name_split

    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{exc} (write a literal brace as {{{{ or }}}})") from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        root, rest = formatter_field_name_split(field)
        if not isinstance(root, str) or not root.isidentifier():
            raise ValueError(f"'{{{field}}}' does not start with a column name (write a literal brace as {{{{ or }}}})")
        if any(is_attribute for is_attribute, _ in rest):
            # str.format would read Python attributes of the value: only [index] and [key] are allowed
            raise ValueError(f"'{{{field}}}' reads an attribute; write {{column[index]}} or {{column[key]}}")
        if spec or conversion:
            raise ValueError(f"'{{{field}...}}' has a format spec or conversion; write plain {{{field}}}")
        names.append(root)
    return names


def text_names(kind: str) -> tuple[str, ...]:
    """The texts a format of `kind` ("preference" or "unpaired") is written with, besides the system text."""
    return ("prompt", *ANSWERS[kind])


def required_columns(texts: object, kind: str) -> tuple[str, ...]:
    """The columns every row needs: those the texts read, but the system column (missing: no system text)."""
    names = [c for n in text_names(kind) for c in columns_read(getattr(texts, n))]
    return tuple(dict.fromkeys(c for c in names if c != SYSTEM))


class _Values(dict[str, Any]):
    """A row's values for a format string: a missing or null column reads as empty text."""

    def __missing__(self, key: str) -> str:
        return ""


def render(texts: object, row: dict[str, Any], kind: str) -> dict[str, str]:
    """The prompt and the answers of one row as texts. A placeholder the row cannot fill (an index past the end
    of a list, a key a message lacks) raises `_TextError` naming the text; the caller adds the row."""
    values = _Values({k: "" if v is None else v for k, v in row.items()})
    out = {}
    for name in text_names(kind):
        try:
            out[name] = getattr(texts, name).format_map(values)
        except (LookupError, TypeError, ValueError) as exc:
            raise _TextError(name, exc) from None
    if texts.system and row.get(SYSTEM):  # Axolotl writes the system block only for a non-empty system text
        try:
            out["prompt"] = texts.system.format_map(values) + out["prompt"]
        except (LookupError, TypeError, ValueError) as exc:
            raise _TextError("system", exc) from None
    return out


class _TextError(Exception):
    """A text of `RowTexts` that a row cannot fill, and why."""

    def __init__(self, name: str, exc: Exception):
        super().__init__(name)
        self.name, self.exc = name, exc


def to_text_rows(ds: Dataset, texts: object, kind: str, *, key: str, path: str,
                 where: Location | None = None) -> Dataset:
    """The dataset with its prompt and answer columns written by `texts` (other columns kept: the label, a
    margin), after checking that every column the texts read is there."""
    import datasets

    found = list(ds.column_names)
    missing = [c for c in required_columns(texts, kind) if c not in found]
    if missing:
        raise RecipeError(f"column '{missing[0]}' (read by the texts) not found in '{path}'; columns found: "
                          f"{', '.join(found)}", key=f"{key}.texts", location=where,
                          hint=f"rename a column to it with columns: {{{missing[0]}: <your column>}}")
    names = text_names(kind)

    def convert(row: dict[str, Any], index: int) -> dict[str, str]:
        try:
            return render(texts, row, kind)
        except _TextError as err:
            template = getattr(texts, err.name)
            raise RecipeError(f"row {index + 1} of '{path}': texts.{err.name} {template!r} cannot be filled: "
                              f"{type(err.exc).__name__} {err.exc}", key=f"{key}.texts.{err.name}",
                              location=where) from None

    datasets.disable_progress_bars()
    try:
        cached = {} if isinstance(ds, datasets.IterableDataset) else {"load_from_cache_file": False}
        return ds.map(convert, with_indices=True, remove_columns=[c for c in names if c in found], **cached)
    finally:
        datasets.enable_progress_bars()
