"""User-facing errors: where the problem is, what is wrong, and how to fix it.

Every mistake a user can make (in a recipe, a data file, a command-line argument) surfaces as a
`RecipeError` holding one or more `Problem`s. The CLI renders them as
``file:line:col dotted.key: message`` lines plus hints, exits with code 2 and shows no traceback.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from recipeforge.credentials import is_secret_key, last_part as _last_part, redact_credentials

Path = tuple  # a key path into a recipe: ("data", "datasets", 0, "format")

# Bounds on what a message may echo of user input (a value, a key, a file's contents): a hostile or
# mistaken value (a password, a whole file pulled in by `extends:`, a megabyte string) must never be
# copied into the terminal or a log in full. Every rendered message goes through `bounded_text`.
MAX_EXCERPT = 60       # characters of one quoted value
MAX_LINE = 400         # characters of one message line
MAX_PROBLEMS = 30      # problems rendered in full; the rest are counted


@dataclass(frozen=True)
class Location:
    """A place in a source: a file (or a pseudo-source such as ``<cli>``) with 1-based line/column."""

    file: str
    line: int | None = None
    col: int | None = None

    def render(self) -> str:
        name = bounded_text(_display_path(self.file).replace("\n", "\\n"), MAX_LINE // 2)
        if name.startswith("<cli ") and len(name) > MAX_EXCERPT + 6:  # <cli key=VALUE>: a short excerpt only
            name = name[:MAX_EXCERPT + 5] + "...>"
        elif name.startswith("<") and len(name) > MAX_LINE // 4:  # <env NAME>
            name = name[:MAX_LINE // 4] + "...>"
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
            key = bounded_text(self.key.replace("\n", "\\n"))
            head.append(key if len(key) <= MAX_EXCERPT else key[:MAX_EXCERPT - 3] + "...")
        prefix = " ".join(head)
        message = bounded_text(self.message)
        if self.key and is_secret_key(self.key):
            # The value of a key named like a password never shows, not even in a "(got ...)" part;
            # the key's own name may.
            name = _last_part(self.key)
            message = _QUOTED.sub(lambda m: m.group(0) if m.group(0)[1:-1] == name else "'***'", message)
        line = f"{prefix}: {message}" if prefix else message
        if self.hint:
            line += f"\n  hint: {bounded_text(self.hint)}"
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
        body = "\n".join(p.render() for p in self.problems[:MAX_PROBLEMS])
        if len(self.problems) > MAX_PROBLEMS:
            body += f"\n... and {len(self.problems) - MAX_PROBLEMS} more"
        if len(self.problems) > 1:
            return f"{len(self.problems)} problems:\n{body}"
        return body

    def __str__(self) -> str:  # dataclass would otherwise override Exception.__str__
        return self.render()


# A quoted value in a message, as repr() writes it.
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def _escape(text: str) -> str:
    # Control characters (a terminal escape sequence, a NUL) and lone surrogates (bytes that were not
    # UTF-8) are written as escapes, as repr() does; newlines stay (messages may span lines).
    return "".join(ch if ch == "\n" or (ch.isprintable() and not 0xD800 <= ord(ch) <= 0xDFFF)
                   else repr(ch)[1:-1] for ch in text)


# A command a message tells the user to run (`recipeforge push 'my run'`, in backticks or to the end of
# its line): copied as it is, it must stay whole, so its quoted paths are not shortened (nor its line, up
# to `MAX_COMMAND`).
_COMMAND = re.compile(r"`(?:recipeforge|python|pip|sbatch|kubectl|hf) [^`\n]*`"
                      r"|\brecipeforge (?:push|train|eval|export|merge|serve|chat|launch|preprocess) [^`\n]*")
MAX_COMMAND = 4000


def bounded_text(text: object, limit: int = MAX_LINE) -> str:
    """`text` safe to print: escaped, URL credentials hidden, quoted values cut to `MAX_EXCERPT`
    characters and each line to `limit`; a command in backticks (`_COMMAND`) is kept whole."""
    text = redact_credentials(_escape(str(text)))
    if len(text) <= MAX_EXCERPT:
        return text
    commands = [m for m in _COMMAND.finditer(text) if len(m.group(0)) <= MAX_COMMAND]
    pieces, last = [], 0
    for m in commands:
        pieces.append(_QUOTED.sub(lambda q: _cut_quoted(q.group(0)), text[last:m.start()]))
        pieces.append(m.group(0))
        last = m.end()
    pieces.append(_QUOTED.sub(lambda q: _cut_quoted(q.group(0)), text[last:]))
    text = "".join(pieces)
    return "\n".join(line if len(line) <= limit or (_COMMAND.search(line) and len(line) <= MAX_COMMAND + limit)
                     else line[:limit - 3] + "..." for line in text.split("\n"))


def _cut_quoted(quoted: str) -> str:
    if len(quoted) <= MAX_EXCERPT + 2:
        return quoted
    inner, quote = quoted[1:-1], quoted[-1]
    return f"{quote}{_head_tail(inner, MAX_EXCERPT)}{quote} ({len(inner)} characters)"


def _head_tail(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping its start and its end: the end of a path or an
    id is usually the part that names it."""
    head = limit // 2
    return f"{text[:head]}...{text[-(limit - head):]}"


def excerpt(value: object, limit: int = MAX_EXCERPT) -> str:
    """A short, escaped, repr-like quote of a user value for a message: ``'abc...' (1200 characters)``."""
    text = redact_credentials(value if isinstance(value, str) else repr(value))
    if isinstance(value, str):
        if len(text) <= limit:
            return repr(text)
        return f"{repr(_head_tail(text, limit))} ({len(text)} characters)"
    return _escape(text if len(text) <= limit else text[:limit] + "...")


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
