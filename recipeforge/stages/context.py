"""The contexts a stage runner gets: this process's place in the job, the recipe (enough to prepare
data), and the whole training context built once per worker (`StageContext`, immutable)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from recipeforge.errors import Location
from recipeforge.log import log
from recipeforge.outputs.run_dir import RunDir

if TYPE_CHECKING:
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.config.schema import Recipe
    from recipeforge.plan.types import Plan

Logger = Callable[[str], None]
# Where the recipe sets the key at a path (`RecipeContext.locate`), for error messages.
Locate = Callable[[tuple[Any, ...]], Location | None]


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a launched job (torchrun / accelerate launch set the variables)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "DistInfo":
        def num(name: str, default: int) -> int:
            try:
                return int(environ.get(name, default))
            except ValueError:
                return default
        return cls(num("RANK", 0), num("LOCAL_RANK", 0), num("WORLD_SIZE", 1))


def _no_wait() -> None:
    """The barrier of a single process: nobody to wait for."""


def quiet(message: str) -> None:
    """The log of a process that says nothing (ranks other than the main one)."""


@dataclass(frozen=True, kw_only=True)
class RecipeContext:
    """What preparing a recipe's data needs: the loaded recipe, this process's place and the log.
    `recipeforge preprocess` and the data step before a launch run a stage's data preparation with
    this alone (there is no plan and no run directory then)."""

    loaded: "LoadedRecipe"            # recipe, path, provenance tree
    dist: DistInfo = field(default_factory=DistInfo)
    log: Logger = log

    @property
    def recipe(self) -> "Recipe":
        return self.loaded.recipe

    @property
    def base_dir(self) -> Path | None:
        """The folder of the recipe file (relative data paths start there)."""
        path = self.loaded.path
        return Path(path).resolve().parent if path else None

    def locate(self, path: tuple[Any, ...]) -> Location | None:
        """Where the recipe sets the key at `path` (for error messages)."""
        tree = self.loaded.tree
        return tree.locate(path) if tree is not None else None


@dataclass(frozen=True)
class WorkerHooks:
    """What a backend's `setup_worker` hands the stage when it loads the model its own way.

    `load_sharded(path, dtype=, attn_implementation=, revision=, trust_remote_code=)` loads the model
    already sharded (a tensor-parallel or shard-by-shard loader); `prepare_trainer(trainer)`
    finishes a model `load_sharded` left incomplete, once the trainer (and its Accelerator) exists.
    `makes_random`: `load_sharded` also takes `random=` (a `components.model_init.RandomInit`) and
    makes a random-init model shard by shard; otherwise a random-init base is written to disk first
    and loaded from there."""

    load_sharded: Callable[..., Any] | None = None
    prepare_trainer: Callable[[Any], None] | None = None
    makes_random: bool = False


@dataclass(frozen=True, kw_only=True)
class StageContext(RecipeContext):
    """Everything a training runner gets, built once per worker and never changed: the recipe, the
    plan, the run directory, and from the distributed side plain callables handed in by the worker
    (`recipeforge.run`): a barrier, the final-weights saver and the backend's `WorkerHooks`. Stages
    never import a backend or hold one."""

    plan: "Plan"
    run: RunDir
    resume_from: Path | None = None
    backend_kwargs: Mapping[str, Any] = field(default_factory=dict)  # trainer arguments from the backend (merged last)
    # Waits for every process of a launched job (one process: returns at once).
    barrier: Callable[[], None] = _no_wait
    # save_final(ctx, trainer, model, tokenizer) writes final/, called on every rank since gathering
    # sharded weights is collective (the backend's `save_final`); None: the main process saves.
    save_final: Callable[..., Any] | None = None
    hooks: WorkerHooks = field(default_factory=WorkerHooks)

    @property
    def load_sharded(self) -> Callable[..., Any] | None:
        return self.hooks.load_sharded

    @property
    def prepare_trainer(self) -> Callable[[Any], None] | None:
        return self.hooks.prepare_trainer
