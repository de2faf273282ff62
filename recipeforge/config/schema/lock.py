"""`lock:` — what a recipe was resolved against: package versions, model revision, data fingerprints,
the planned hardware. Written by `recipeforge resolve --lock`; `train` compares it with the machine."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from recipeforge.config.schema.base import Section


class ModelLock(Section):
    """The model a lock pins."""

    name_or_path: str = Field(description="`model.name_or_path` when the lock was written.")
    revision: Optional[str] = Field(
        None, description="Hub: the commit hash (or the requested revision, see `note`); local directory: "
                          "`sha256:<hash of its files>`; `tiny:*`: `spec:<hash of its settings>`.")
    source: str = Field(description="How `revision` was found: hub-cache | requested | local | tiny.")
    note: Optional[str] = Field(None, description="Why the revision could not be pinned further.")


class DatasetLock(Section):
    """One dataset entry a lock pins."""

    key: str = Field(description="Where the dataset is in the recipe, e.g. data.datasets[0].")
    path: str = Field(description="`path` of the dataset entry.")
    fingerprint: str = Field(
        description="Local file or directory: `sha256:<content hash>`; hub dataset: `<id>@<revision>`.")
    source: str = Field(description="local | hub-cache | requested.")


class LockConfig(Section):
    """The environment a recipe was resolved in; `train` warns (or with --strict refuses) when it differs."""

    recipeforge: str = Field(description="recipeforge version that wrote the lock.")
    packages: dict[str, Optional[str]] = Field(
        default_factory=dict, description="Installed versions by distribution name (null: not installed).")
    model: ModelLock = Field(description="The model's resolved revision.")
    datasets: tuple[DatasetLock, ...] = Field((), description="Fingerprint of every training and eval dataset.")
    hardware: dict[str, Any] = Field(
        default_factory=dict, description="The plan's hardware and layout (nodes, gpus_per_node, gpu, backend, "
                                          "world_size).")
