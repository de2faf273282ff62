"""Numbers that cannot work together: batch sizes, steps and warmup against the data there is.

The planner only knows the recipe, so it can refuse an absurd gradient accumulation
(`check_plan_numbers`). Whether one optimizer step fits the data, how many passes `max_steps` makes
and whether warmup ends before the run does need the row count, so `check_data_numbers` runs once
the data is prepared (packed sequences counted after packing) and before anything trains.

Refused (exit 2): a step that needs more rows than the data has (the trainer would silently take
smaller steps, or one step over everything), and warmup that lasts the whole run. Warned: `max_steps`
that repeats the data many times, and warmup that takes more than half of the run.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol

from recipeforge.components.prepared import PreparedData
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import rl_section


class PlanBatch(Protocol):
    """The batch a plan settled on (`plan.types.Plan`; components do not import the planner)."""

    @property
    def global_batch_size(self) -> int: ...
    @property
    def micro_batch_size(self) -> int: ...
    @property
    def gradient_accumulation(self) -> int: ...
    @property
    def data_parallel(self) -> int: ...

MAX_ACCUMULATION = 65536      # forward/backward passes per optimizer step; more is a typo, not a plan
MANY_PASSES = 10              # max_steps that repeat the data more often than this get a warning
LONG_WARMUP = 0.5             # warmup taking more than this share of the run gets a warning


def check_plan_numbers(plan) -> None:
    """Refuse a plan whose gradient accumulation no run could get through."""
    if plan.gradient_accumulation > MAX_ACCUMULATION:
        micro = plan.micro_batch_size * plan.data_parallel
        raise RecipeError(
            f"global batch {plan.global_batch_size} needs {plan.gradient_accumulation} accumulated forward/backward "
            f"passes per optimizer step (micro batch {plan.micro_batch_size} x {plan.data_parallel} data-parallel "
            f"rank(s) each); more than {MAX_ACCUMULATION} is not a workable run", key="train.global_batch_size",
            hint=f"a global batch is a number of sequences per step: use at most {MAX_ACCUMULATION * micro}, "
                 f"typically 8 to 2048")


def check_data_numbers(recipe: Any, plan: PlanBatch | None, data: PreparedData,
                       log: Callable[[str], None] = lambda message: None) -> None:
    """Check the recipe's batch, steps and warmup against the prepared training `data` (`plan` is
    None for `recipeforge preprocess`, which checks against the recipe's own global batch)."""
    if not hasattr(data.train, "__len__"):
        return  # a stream (`data.streaming`): no length to check against; train.max_steps is required
    rows = len(data.train)
    if rows <= 0:
        return
    if plan is not None:
        check_numbers(recipe, rows, data.unit, global_batch=plan.global_batch_size, micro=plan.micro_batch_size,
                      accumulation=plan.gradient_accumulation, data_parallel=plan.data_parallel, log=log)
    else:
        check_numbers(recipe, rows, data.unit, global_batch=recipe.train.global_batch_size, log=log)


def check_numbers(recipe, rows: int, unit: str, *, global_batch: int, micro: int | None = None,
                  accumulation: int | None = None, data_parallel: int = 1,
                  log: Callable[[str], None] = lambda message: None) -> None:
    """The checks of `check_data_numbers` on plain numbers (see the module docstring)."""
    t = recipe.train
    rl = rl_section(recipe)
    generations = rl[1].num_generations if rl is not None else 1
    per_step = max(1, global_batch // generations)
    if per_step > rows:
        took = (f"train.global_batch_size {global_batch} / {rl and rl[0]}.num_generations {generations} = {per_step}"
                if generations > 1 else f"train.global_batch_size {global_batch}")
        most = rows * generations
        raise RecipeError(
            f"one optimizer step takes {per_step} {unit} ({took}), and the training data has only {rows}",
            key="train.global_batch_size",
            hint=f"lower train.global_batch_size to at most {most}"
                 + (f" (a multiple of {generations})" if generations > 1 else "") + ", or add training data")
    if micro and accumulation and generations == 1:
        # The Trainer's count: batches per rank, then optimizer steps (a last partial step included).
        batches = math.ceil(math.ceil(rows / data_parallel) / micro)
        per_epoch = math.ceil(batches / accumulation)
    else:
        per_epoch = math.ceil(rows / per_step)
    total = t.max_steps or max(1, math.ceil((t.epochs or 1.0) * per_epoch))
    passes = total * per_step / rows
    if t.max_steps and passes > MANY_PASSES:
        log(f"warning: train.max_steps {t.max_steps} x {per_step} {unit} per step = {passes:.1f} passes over the "
            f"{rows} {unit} of the training data (the data repeats; lower max_steps or add data if that is not meant)")
    if t.scheduler == "constant":
        return  # no warmup in a constant schedule
    length = f"{total} optimizer steps" + ("" if t.max_steps else f": {t.epochs or 1.0:g} epoch(s) of {per_epoch}")
    if t.warmup_steps is not None and t.warmup_steps >= total:
        raise RecipeError(
            f"train.warmup_steps {t.warmup_steps} is not shorter than the run ({length}): the learning rate "
            f"would never reach train.learning_rate", key="train.warmup_steps",
            hint=f"use fewer warmup steps (e.g. {max(1, total // 20)}), or train.warmup_ratio")
    warm = t.warmup_steps if t.warmup_steps is not None else math.ceil(t.warmup_ratio * total)
    if warm > LONG_WARMUP * total:
        key = "train.warmup_steps" if t.warmup_steps is not None else "train.warmup_ratio"
        log(f"warning: warmup takes {warm} of the run's {length} ({key}); the learning rate peaks only at step "
            f"{warm}")
