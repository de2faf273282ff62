"""The conversion being built: the recipe so far, what became of each Axolotl key, and the report.

The modules of `recipeforge.config.axolotl` each add their part to one `Conversion`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipeforge.json_value import JSONValue


@dataclass
class Conversion:
    """The recipe being built, and what became of each Axolotl key."""

    config: dict[str, Any]
    source: Path
    world_size: int = 1
    recipe: dict[str, Any] = field(default_factory=dict)
    mapped: dict[str, str] = field(default_factory=dict)   # axolotl key -> recipe key(s) it became
    notes: dict[str, str] = field(default_factory=dict)    # axolotl key -> why it has no counterpart / what instead
    # axolotl key -> how the recipe trains other tokens, masks or parameters than Axolotl would, and the fix
    changes: dict[str, str] = field(default_factory=dict)
    vision: str | None = None  # why the config trains a vision-language model; None: a text model

    def get(self, key: str, default: JSONValue = None) -> Any:
        """The config's value of `key` (top level)."""
        value = self.config.get(key)
        return default if value is None else value

    def put(self, target: str, value: JSONValue, source: str | None = None) -> None:
        """Set the dotted recipe key `target` to `value`; `source` (an Axolotl key) counts as mapped."""
        node = self.recipe
        parts = target.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        if source is not None:
            self.map(source, target)

    def map(self, source: str, target: str) -> None:
        """Record that Axolotl key `source` became recipe key `target`."""
        self.mapped[source] = f"{self.mapped[source]}, {target}" if source in self.mapped else target

    def note(self, source: str, why: str) -> None:
        """Record that `source` has no (exact) counterpart, with what the recipe does instead."""
        self.notes[source] = f"{self.notes[source]}; {why}" if source in self.notes else why

    def change(self, source: str, why: str) -> None:
        """Record that, because of `source`, the recipe trains other tokens, masks or parameters than Axolotl
        would; `why` says what differs and the recipe key that restores Axolotl's behaviour."""
        self.changes[source] = f"{self.changes[source]}; {why}" if source in self.changes else why

    def section(self, name: str) -> dict[str, Any]:
        return self.recipe.setdefault(name, {})

    # -- output ---------------------------------------------------------------------------------

    def report_lines(self) -> list[str]:
        return [f"{key}: {why}" for key, why in self.notes.items()]

    def change_lines(self) -> list[str]:
        """The semantic changes: where the recipe trains differently from Axolotl, with the fix."""
        return [f"{key}: {why}" for key, why in self.changes.items()]

    CHANGES_HEAD = "Trains differently from Axolotl (what differs, and the recipe key that restores Axolotl's way):"

    def report_text(self) -> str:
        """The report printed to stderr."""
        lines = self.report_lines()
        changes = self.change_lines()
        head = (f"converted {self.source} ({len(self.mapped)} keys mapped, {len(lines)} in this report, "
                f"{len(changes)} semantic change{'' if len(changes) == 1 else 's'}; global batch assumes a world "
                f"size of {self.world_size})\n")
        if self.vision is not None:
            head += f"{self.vision_line()}\n"
        text = head + "".join(f"  {line}\n" for line in lines)
        if changes:
            text += f"{self.CHANGES_HEAD}\n" + "".join(f"  {line}\n" for line in changes)
        return text

    def vision_line(self) -> str:
        return (f"A vision-language model ({self.vision}): model.vision says which of its parts train and how "
                f"images are sized.")

    def recipe_text(self) -> str:
        """The recipe YAML, headed by the report as comments."""
        import textwrap

        head = [f"Converted from the Axolotl config {self.source.name} by `recipeforge convert axolotl`.",
                f"Global batch = micro_batch_size x gradient_accumulation_steps x world size {self.world_size} "
                f"(--world-size).",
                *([self.vision_line()] if self.vision is not None else []),
                "Keys without a counterpart, and what this recipe does instead:"]
        comments = [f"# {line}" for line in head]
        for line in self.report_lines():
            wrapped = textwrap.wrap(line, 110, subsequent_indent="    ") or [line]
            comments += [f"#   {w}" for w in wrapped]
        if self.changes:
            comments.append(f"# {self.CHANGES_HEAD}")
            for line in self.change_lines():
                wrapped = textwrap.wrap(line, 110, subsequent_indent="    ") or [line]
                comments += [f"#   {w}" for w in wrapped]
        body = yaml.dump(self.recipe, Dumper=_RecipeDumper, sort_keys=False, allow_unicode=True, width=100)
        return "\n".join(comments) + "\n" + body


class _RecipeDumper(yaml.SafeDumper):
    """Safe YAML where a text with line breaks (a prompt template) is written in double quotes with \\n, as it
    reads in Axolotl's code, instead of folded over several lines."""


def _text(dumper: yaml.SafeDumper, value: str):
    style = '"' if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RecipeDumper.add_representer(str, _text)
