"""Before any worker exists: the run directory, the tokenized data and the backend's own preparation."""

from __future__ import annotations

from recipeforge import start_up
from recipeforge.backends.base import Backend
from recipeforge.backends.cluster import ClusterSpec
from recipeforge.backends.data_ready import build_before_launch
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.log import log
from recipeforge.outputs.run_dir import RunDir
from recipeforge.plan.types import Plan
from recipeforge.run.run_directory import prepare_run


def prepare_launch(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, cluster: ClusterSpec, *,
                   overwrite: bool, force: bool) -> None:
    """Before any worker exists: the main node takes and prepares the run directory; every node
    tokenizes the data (a worker waiting for another's tokenization inside a collective would run into
    the process-group timeout; the workers then read the cache); the main node runs the backend's step
    before launch (Megatron's checkpoint conversion)."""
    start_up.resume(*start_up.TOKENIZING)  # the data is prepared here, with the collector on
    if cluster.is_main_node:
        prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    build_before_launch(loaded, log=log)
    if cluster.is_main_node:
        backend.prepare_launch(loaded, plan, run, log=log)
