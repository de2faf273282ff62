"""`train.unfrozen_parameters`: which parameters a full fine-tune trains, by name pattern.

The patterns follow Axolotl's `unfrozen_parameters`, so a migrated config selects the same
parameters:

- a dot not followed by ``+`` is a literal dot (``model.layers.0`` needs no escaping; ``.+`` still
  means "one or more of anything");
- a pattern is matched from the start of the parameter name (``re.match``), not anywhere in it and
  not to its end: ``model.layers.1`` also selects ``model.layers.10``; end a pattern with ``$``
  to stop it there;
- an optional trailing ``[i]``, ``[start:end]``, ``[start:]`` or ``[:end]`` trains only those rows
  (first dimension) of the matched parameters, e.g. new token embeddings ``^model.embed_tokens.weight$[32000:]``.

Pure Python: the recipe schema, the planner (against the names it derives from a model's config)
and the stage runner (against the loaded model) share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$")


@dataclass(frozen=True)
class ParamPattern:
    """One `unfrozen_parameters` entry: the compiled name pattern and an optional row range."""

    raw: str
    regex: re.Pattern
    rows: tuple[int, int | None] | None = None  # [start, end) of the first dimension; end None: to the end

    def matches(self, name: str) -> bool:
        """Whether the parameter called `name` is selected (matched from the start of the name)."""
        return self.regex.match(name) is not None


def parse_pattern(raw: str) -> ParamPattern:
    """Compile one entry. Raises ValueError with a short reason for an invalid regular expression
    or row range."""
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError("an empty pattern selects nothing")
    name, rows = raw, None
    found = _RANGE.match(raw)
    if found:
        name, start, end = found.groups()
        if end is None and start.isdecimal():
            rows = (int(start), int(start) + 1)
        else:
            lo, hi = int(start) if start else 0, int(end) if end else None
            if hi is not None and lo >= hi:
                raise ValueError(f"row range [{start}:{end}] is empty: the end must be greater than the start")
            rows = (lo, hi)
    try:
        regex = re.compile(re.sub(r"\.(?!\+)", r"\\.", name))
    except re.error as exc:
        raise ValueError(f"not a valid regular expression ({exc})") from None
    return ParamPattern(raw=raw, regex=regex, rows=rows)


def selected(patterns: list[ParamPattern], names) -> tuple[list[str], list[int]]:
    """The names any pattern selects (in the given order), and the indices of patterns that select
    none of them."""
    chosen = [n for n in names if any(p.matches(n) for p in patterns)]
    unused = [i for i, p in enumerate(patterns) if not any(p.matches(n) for n in names)]
    return chosen, unused


def examples(names: list[str], limit: int = 6) -> str:
    """A few parameter names to show next to a pattern that matched nothing: the first ones, and
    one from each differently named part of the first decoder layer."""
    picked: list[str] = []
    for n in names:
        if len(picked) >= limit:
            break
        shape = re.sub(r"\.\d+\.", ".N.", n)
        if not any(re.sub(r"\.\d+\.", ".N.", p) == shape for p in picked):
            picked.append(n)
    return ", ".join(picked) + (", ..." if len(names) > len(picked) else "")
