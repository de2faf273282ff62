"""Stage runners: pretrain, sft, dpo, grpo. Each implements `stages.base.StageRunner`."""

from __future__ import annotations

import importlib

# stage name -> "module:class"; imported only when a run needs it (TRL imports take seconds).
RUNNERS = {
    "pretrain": "recipeforge.stages.pretrain:PretrainStage",
    "sft": "recipeforge.stages.sft:SFTStage",
    "dpo": "recipeforge.stages.dpo:DPOStage",
    "grpo": "recipeforge.stages.grpo:GRPOStage",
}


def runner_class(stage: str):
    """The runner class of `stage`."""
    module, _, name = RUNNERS[stage].partition(":")
    return getattr(importlib.import_module(module), name)
