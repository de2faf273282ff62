"""`recipeforge convert axolotl`: an Axolotl YAML config as a recipeforge recipe.

Every top-level Axolotl key (and every key of a dataset entry, `trl:`, `fsdp_config:` and a DeepSpeed
JSON file) is either mapped to a recipe key or listed in the report with the reason it has no
counterpart and what the recipe does instead; nothing is dropped silently. The YAML is read with
`yaml.safe_load` (no tags, no code); reward functions named by dotted path are written as
``module:function`` code references, which recipeforge imports only after an explicit opt-in
(`--trust-code` or `allow_code: true`, which the converter never writes).

Modules: `convert` (this file: the pass over the config), `datasets` (dataset entries and their
types), `preference` (the DPO, KTO and ORPO types), `distill` (the KD plugin), `training` (model, adapter, optimisation, precision, logging, output), `vision`
(multimodal configs: `model.vision`, image sizes, processor keys), `backend` (DeepSpeed, FSDP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipeforge.errors import RecipeError


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

    def get(self, key: str, default: Any = None) -> Any:
        """The config's value of `key` (top level)."""
        value = self.config.get(key)
        return default if value is None else value

    def put(self, target: str, value: Any, source: str | None = None) -> None:
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


def read_config(path: str | Path) -> dict[str, Any]:
    """The Axolotl config at `path` as data; a file that is not one is a `RecipeError` (exit 2)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"{path}: cannot read the file ({exc.__class__.__name__}: {exc})",
                          hint="give the path of an Axolotl YAML config") from None
    try:
        data = yaml.safe_load(text)  # safe: plain data only, no Python tags
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})",
                          hint="give the path of an Axolotl YAML config") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: an Axolotl config is a mapping of keys, this file holds "
                          f"{type(data).__name__ if data is not None else 'nothing'}",
                          hint="give the path of an Axolotl YAML config (base_model:, datasets:, ...)")
    if not isinstance(data.get("base_model"), str) or not data["base_model"].strip():
        raise RecipeError(f"{path}: no base_model, so this is not an Axolotl config", key="base_model",
                          hint="an Axolotl config names its model with base_model: <hub id or path>")
    if not data.get("datasets") and not data.get("pretraining_dataset"):
        raise RecipeError(f"{path}: neither datasets nor pretraining_dataset is set", key="datasets",
                          hint="an Axolotl training config lists its data under datasets:")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeError(f"{path}: keys must be text, found {bad[0]!r}")
    return data


def convert_config(config: dict[str, Any], source: str | Path = "config.yaml", *, world_size: int = 1) -> Conversion:
    """Convert Axolotl `config` (data) to a recipe; `source` is the file it came from (DeepSpeed JSON
    paths are read relative to it)."""
    from recipeforge.config.axolotl import backend, datasets, distill, stages, training, vision

    conv = Conversion(config=config, source=Path(source), world_size=world_size, vision=vision.detect(config))
    for key, value in config.items():
        if value is None or value == [] or value == {}:
            conv.mapped[key] = "(unset: the recipe default)"
    stages.stage(conv)
    conv.recipe["name"] = Path(source).stem
    conv.recipe["description"] = f"Converted from the Axolotl config {Path(source).name}."
    training.model(conv)
    training.adapter(conv)
    datasets.data(conv)
    training.optimisation(conv)
    stages.stage_settings(conv)
    distill.settings(conv)
    vision.settings(conv)
    backend.distributed(conv)
    training.logging_output(conv)
    backend.compatibility(conv)
    for key in config:
        if key not in conv.mapped and key not in conv.notes:
            conv.note(key, "no counterpart in recipeforge; not converted")
    return conv


def convert_file(path: str | Path, *, world_size: int = 1) -> Conversion:
    """Read and convert the Axolotl config at `path`."""
    return convert_config(read_config(path), path, world_size=world_size)
