"""A checkpoint read one tensor at a time: its local directory (a hub model's snapshot fetched once) and which
safetensors file holds each tensor, for loaders that never hold the whole base (`sharded_loading`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from recipeforge.errors import Location


def local_checkpoint(name_or_path: str, revision: str | None = None, *, location: Location | None = None) -> str:
    """The local directory of a checkpoint: the directory itself, or a hub model's snapshot in the
    Hugging Face cache (its config and safetensors files, fetched if missing; every process asks,
    the hub client's file locks let one download). A checkpoint without safetensors files is a user
    error: this loader reads tensors one by one, which pickled weights do not allow."""
    from recipeforge.errors import RecipeError

    root = Path(name_or_path).expanduser()
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(name_or_path, revision=revision,
                                      allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    if not any(root.glob("*.safetensors")):
        raise RecipeError(f"'{name_or_path}' has no safetensors weights, which QLoRA on FSDP or ZeRO-3 reads "
                          f"tensor by tensor to load only each process's shard", key="model.name_or_path",
                          location=location,
                          hint="convert the checkpoint to safetensors (save_pretrained does by default)")
    return str(root)


def checkpoint_files(path: str) -> dict[str, Path]:
    """Tensor name -> safetensors file of a local checkpoint directory (sharded or not)."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {k: root / v for k, v in weight_map.items()}
    single = root / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"no safetensors checkpoint in {root} (low-memory 4-bit loading reads local "
                                f"safetensors files)")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def read_tensor(files: dict[str, Path], key: str, aliases: dict[str, str]) -> torch.Tensor:
    """One tensor of the checkpoint; `aliases` names where tied weights are stored."""
    from safetensors import safe_open

    if key not in files:
        key = aliases.get(key, key)
    if key not in files:
        raise KeyError(f"tensor '{key}' is not in the checkpoint; low-memory 4-bit loading needs a checkpoint "
                       f"whose tensor names are the model's parameter names")
    with safe_open(str(files[key]), framework="pt") as f:
        tensor: torch.Tensor = f.get_tensor(key)
        return tensor
