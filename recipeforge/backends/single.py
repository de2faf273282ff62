"""One process, no launcher: the stage trains in the process that runs `recipeforge train`."""

from __future__ import annotations

from recipeforge.backends.base import TrainerBackend


class SingleBackend(TrainerBackend):
    """The whole model on one device (a GPU, or the CPU)."""

    name = "single"

    def launcher(self, plan) -> str:
        return "none"
