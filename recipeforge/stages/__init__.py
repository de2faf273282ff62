"""Stage runners: pretrain, sft, dpo, grpo, orpo, kto, cpo. Each implements `stages.base.StageRunner`."""

from __future__ import annotations

import importlib

from recipeforge.capabilities import Stage

# stage name -> "module:class"; imported only when a run needs it (TRL imports take seconds).
RUNNERS = {
    Stage.PRETRAIN: "recipeforge.stages.pretrain:PretrainStage",
    Stage.SFT: "recipeforge.stages.sft:SFTStage",
    Stage.DPO: "recipeforge.stages.dpo:DPOStage",
    Stage.GRPO: "recipeforge.stages.grpo:GRPOStage",
    Stage.ORPO: "recipeforge.stages.orpo:ORPOStage",
    Stage.KTO: "recipeforge.stages.kto:KTOStage",
    Stage.CPO: "recipeforge.stages.cpo:CPOStage",
    Stage.REWARD: "recipeforge.stages.reward:RewardStage",
}


def runner_class(stage: str, runner: str | None = None):
    """The runner class of `stage`, or `runner` (``"module:Class"``) when the backend trains with a
    loop of its own (`BackendSpec.runner`)."""
    spec = runner or RUNNERS[stage]
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)
