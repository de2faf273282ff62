"""What every process of recipeforge sets before the libraries load: no telemetry."""

from __future__ import annotations

import os


def network_guards() -> None:
    """No telemetry of any kind, from any library, set before they are imported (they read it once).

    Hub access itself is left alone: a tiny model with local data never asks the hub for anything,
    and forcing offline mode would break hub ids for anything later in the same process.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
