"""User-facing errors: where the problem is, what is wrong, and how to fix it.

Every mistake a user can make (in a recipe, a data file, a command-line argument) surfaces as a
`RecipeError` holding one or more `Problem`s. The CLI renders them as
``file:line:col dotted.key: message`` lines plus hints, exits with code 2 and shows no traceback.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

Path = tuple  # a key path into a recipe: ("data", "datasets", 0, "format")


@dataclass(frozen=True)
class Location:
    """A place in a source: a file (or a pseudo-source such as ``<cli>``) with 1-based line/column."""

    file: str
    line: int | None = None
    col: int | None = None

    def render(self) -> str:
        name = _display_path(self.file)
        if self.line is None:
            return name
        if self.col is None:
            return f"{name}:{self.line}"
        return f"{name}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong: message, optional location, key path and hint."""

    message: str
    location: Location | None = None
    key: str | None = None
    hint: str | None = None

    def render(self) -> str:
        head = []
        if self.location is not None:
            head.append(self.location.render())
        if self.key:
            head.append(self.key)
        prefix = " ".join(head)
        line = f"{prefix}: {self.message}" if prefix else self.message
        if self.hint:
            line += f"\n  hint: {self.hint}"
        return line


@dataclass
class RecipeError(Exception):
    """A user error with one or more located problems (exit code 2 at the CLI)."""

    problems: list[Problem] = field(default_factory=list)

    def __init__(self, problems: Problem | Sequence[Problem] | str, *, hint: str | None = None,
                 location: Location | None = None, key: str | None = None):
        if isinstance(problems, str):
            problems = [Problem(problems, location=location, key=key, hint=hint)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        """All problems, one block each; a count header when there are several."""
        body = "\n".join(p.render() for p in self.problems)
        if len(self.problems) > 1:
            return f"{len(self.problems)} problems:\n{body}"
        return body

    def __str__(self) -> str:  # dataclass would otherwise override Exception.__str__
        return self.render()


def format_key(path: Iterable) -> str:
    """Render a key path as ``data.datasets[0].format``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A ``did you mean 'x'?`` hint for the closest choice, or None when nothing is close."""
    choices = [str(c) for c in choices]
    word = str(word)
    # Also try the word without a prefix/suffix part: `lora_alpha` -> `alpha`, `learning_rate_x` -> ...
    variants = [word] + ([word.split("_", 1)[1], word.rsplit("_", 1)[0]] if "_" in word else [])
    match: list[str] = []
    for variant in variants:
        match = difflib.get_close_matches(variant, choices, n=1, cutoff=0.6)
        if match:
            break
    if not match:
        lowered = {c.lower(): c for c in choices}
        if word.lower() in lowered:
            match = [lowered[word.lower()]]
    return f"did you mean '{match[0]}'?" if match else None


def _display_path(file: str) -> str:
    """Paths relative to the working directory when below it; pseudo-sources unchanged."""
    if file.startswith("<"):
        return file
    try:
        rel = os.path.relpath(file)
    except ValueError:  # different drive on Windows
        return file
    return file if rel.startswith("..") else rel


def sort_problems(problems: Iterable[Problem]) -> list[Problem]:
    """Problems in reading order: by file, line, column."""
    def key(p: Problem):
        loc = p.location
        return (loc.file, loc.line or 0, loc.col or 0) if loc else ("", 0, 0)
    return sorted(problems, key=key)


def parse_key(key: str) -> tuple:
    """Inverse of `format_key`: ``data.datasets[0].format`` -> ("data", "datasets", 0, "format")."""
    import re

    out: list = []
    for part in key.split("."):
        name, *indices = re.split(r"\[(\d+)\]", part)
        if name:
            out.append(name)
        out.extend(int(i) for i in indices if i != "")
    return tuple(out)


def locate_problems(error: RecipeError, locate) -> RecipeError:
    """Fill in the location of keyed problems that have none (e.g. from the planner), using
    `locate(path) -> Location` (a recipe's provenance)."""
    # Keys that are command-line options (--hardware) have no place in the recipe.
    fixed = [Problem(p.message, locate(parse_key(p.key)), p.key, p.hint)
             if p.location is None and p.key and not p.key.startswith("-") else p for p in error.problems]
    return RecipeError(fixed)
