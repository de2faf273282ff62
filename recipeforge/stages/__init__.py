"""Stage runners, one per stage of `stage_specs.STAGE_SPECS` (a plugin's stage names its own runner in its
spec). Each implements `stages.base.StageRunner`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from recipeforge.stage_specs import STAGE_SPECS, stage_spec

if TYPE_CHECKING:
    from recipeforge.stages.base import TrainerStage

# built-in stage name -> "module:class"; imported only when a run needs it (TRL imports take seconds).
RUNNERS: dict[str, str] = {name: spec.runner for name, spec in STAGE_SPECS.items()}


def runner_class(stage: str, runner: str | None = None) -> type[TrainerStage]:
    """The runner class of `stage` (built in, or a plugin's: `StageSpec.runner`), or `runner`
    (``"module:Class"``) when the backend trains with a loop of its own (`BackendSpec.runner`)."""
    spec = runner or RUNNERS.get(stage) or stage_spec(stage).runner
    module, _, name = spec.partition(":")
    cls: type[TrainerStage] = getattr(importlib.import_module(module), name)
    return cls
