"""The stage's runner in one process: set up, trained and saved, with what it measured on the way."""

from __future__ import annotations

from typing import Any

from recipeforge.backends import worker as w
from recipeforge.backends.base import Backend
from recipeforge.stages.context import StageContext


def trained_runner(ctx: StageContext, backend: Backend) -> Any:
    """The stage's runner, set up, trained and saved; running out of memory is answered with the
    plan's numbers and what would fit, as any recipe that does not fit is."""
    from recipeforge import start_up
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.stages import runner_class
    from recipeforge.stages.oom import is_out_of_memory, out_of_memory_error

    runner = runner_class(ctx.recipe.stage, backend.runner(ctx.recipe.stage))(ctx)
    start_up.resume(*start_up.TRAINING)  # libraries imported: data and model made with the collector on
    if ctx.dist.world_size > 1:
        # One process per machine tokenizes and caches the data first (a cache hit when `recipeforge
        # train` built it before launching); the others poll for it outside any collective, then read it
        # in `setup`.
        from recipeforge.backends.data_ready import prepare_on_first_rank

        prepare_on_first_rank(lambda: runner, ctx.dist, broadcast=w.broadcast, barrier=w.barrier, log=ctx.log)
    from recipeforge.outputs import phase_memory

    phase_memory.start(ctx.run.root, ctx.dist.rank)  # phase_memory/rank<N>.json: each phase's peak
    try:
        with phase_memory.phase("load"):
            runner.setup()
        if ctx.dist.is_main and runner.data_stats:
            MetricsWriter(ctx.run.metrics).write({"split": "data", "step": 0, **runner.data_stats})
        load_seconds = getattr(runner, "model_load_seconds", None)
        if ctx.dist.is_main and load_seconds is not None:
            # How long the model took to build or read before the first step (random init included).
            MetricsWriter(ctx.run.metrics).write({"split": "startup", "step": 0,
                                                  "model_load_s": round(load_seconds, 3)})
        with phase_memory.phase("train"):
            runner.train()
        if ctx.dist.is_main and backend.reports_runtime:
            from recipeforge.run.results import write_backend_report

            write_backend_report(ctx, runner, backend)
        with phase_memory.phase("save"):
            runner.save()
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        raise out_of_memory_error(ctx, runner, exc) from None
    return runner
