"""The learning-rate range test's training: the recipe's stage set up in this process, trained with the
test's callbacks (they set each step's rate and stop on divergence), then lr_range.json and its plot
written; the model is not saved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from recipeforge.outputs.trackers import close_all
from recipeforge.run.session import stage_context
from recipeforge.stages import runner_class
from recipeforge.stages.context import DistInfo
from recipeforge.stages.lr_range import RangeResult, make_callbacks, write_files

if TYPE_CHECKING:
    from recipeforge.backends.base import Backend
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan.types import Plan


@dataclass(frozen=True)
class RangeOutcome:
    """The test's result and where its files are."""

    result: RangeResult
    run_dir: Path
    json_path: Path
    png_path: Path | None


def run_range_test(loaded: LoadedRecipe, plan: Plan, run: RunDir, backend: Backend, result: RangeResult,
                   log: Callable[[str], None]) -> RangeOutcome:
    """Set up the stage, train with the test's callback, write the files; the model is not saved."""
    ctx = stage_context(loaded, plan, run, backend, DistInfo(), None)
    runner = runner_class(ctx.recipe.stage, backend.runner(ctx.recipe.stage))(ctx)
    runner.setup()
    first, last = make_callbacks(result, log)
    runner.trainer.callback_handler.callbacks.insert(0, first)  # sets the logged rate before others read it
    runner.trainer.add_callback(last)
    failed = True
    try:
        runner.trainer.train()
        failed = False
    finally:
        close_all(runner.trackers, failed=failed)
    result.finish()
    json_path, png_path = write_files(result, ctx.run.root, log)
    return RangeOutcome(result=result, run_dir=ctx.run.root, json_path=json_path, png_path=png_path)
