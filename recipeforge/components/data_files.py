"""Local dataset files read directly by the `datasets` readers, and the checks that turn their obscure failures
into located errors (a JSON-lines row that is not an object, a blank file)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from recipeforge.errors import Location, RecipeError


class DatasetPath(Protocol):
    """A `data.datasets` entry, as far as the hint goes."""

    @property
    def path(self) -> str: ...


def read_file(path: Path, builder: str) -> Any:
    """A local file through the `datasets` readers directly (no dataset-module lookup, no network)."""
    import datasets

    readers = {"json": datasets.Dataset.from_json, "csv": datasets.Dataset.from_csv,
               "parquet": datasets.Dataset.from_parquet, "text": datasets.Dataset.from_text}
    if builder in readers:
        return readers[builder](str(path))
    return datasets.Dataset.from_file(str(path))  # .arrow


def check_jsonl(path: Path, name: str, *, key: str, location: Location | None) -> None:
    """Name the first unreadable row of a JSON-lines file (the reader only says "parse error")."""
    import json

    with open(path, "rb") as fh:
        for row, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.rstrip(b"\r\n"))
            except json.JSONDecodeError as exc:
                raise RecipeError(f"{name}: row {row} is not valid JSON ({exc.msg} at column {exc.colno})", key=key,
                                  location=location, hint="each line of a .jsonl file holds one JSON object") from None
            except (UnicodeDecodeError, ValueError) as exc:
                raise RecipeError(f"{name}: row {row} is not valid JSON ({exc})", key=key, location=location,
                                  hint="each line of a .jsonl file holds one JSON object") from None
            if not isinstance(value, dict):
                raise RecipeError(f"{name}: row {row} is a JSON {type(value).__name__}, not an object",
                                  key=key, location=location,
                                  hint='each line holds one object, e.g. {"instruction": ..., "output": ...}')


def is_blank(path: Path) -> bool:
    """Whether a text file holds nothing but whitespace (the readers fail on those obscurely)."""
    if path.suffix.lower() in (".parquet", ".arrow"):
        return path.stat().st_size == 0
    with open(path, "rb") as fh:
        return not fh.read(1 << 16).strip() and path.stat().st_size < (1 << 16)


def load_hint(spec: DatasetPath, found: Path | None) -> str:
    """What to check when a dataset could not be read: the file (it exists) or its path."""
    if found is not None:
        return "check that the file is valid (one JSON object per line for .jsonl)"
    return ("hub datasets need network access (or a local copy); for local files give a path that exists, "
            f"e.g. ./{spec.path}.jsonl")
