"""`recipeforge convert axolotl`: an Axolotl YAML config as a recipeforge recipe.

Every top-level Axolotl key (and every key of a dataset entry, `trl:`, `fsdp_config:` and a DeepSpeed
JSON file) is either mapped to a recipe key or listed in the report with the reason it has no
counterpart and what the recipe does instead; nothing is dropped silently. The YAML is read with
`yaml.safe_load` (no tags, no code); reward functions named by dotted path are written as
``module:function`` code references, which recipeforge imports only after an explicit opt-in
(`--trust-code` or `allow_code: true`, which the converter never writes).

Modules: `convert` (this file: the pass over the config), `conversion` (the `Conversion` record each module adds to), `datasets` (dataset entries and their
types), `preference` (the DPO, KTO and ORPO types), `distill` (the KD plugin), `training` (model, adapter, optimisation, precision, logging, output), `vision`
(multimodal configs: `model.vision`, image sizes, processor keys), `backend` (DeepSpeed, FSDP).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from recipeforge.config.axolotl.conversion import Conversion
from recipeforge.errors import RecipeError

__all__ = ["Conversion", "convert_config", "convert_file", "read_config"]


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
