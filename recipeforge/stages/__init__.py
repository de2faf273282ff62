"""Stage runners: pretrain, sft, dpo, grpo, orpo, kto, cpo. Each implements `stages.base.StageRunner`."""

from __future__ import annotations

import importlib

# stage name -> "module:class"; imported only when a run needs it (TRL imports take seconds).
RUNNERS = {
    "pretrain": "recipeforge.stages.pretrain:PretrainStage",
    "sft": "recipeforge.stages.sft:SFTStage",
    "dpo": "recipeforge.stages.dpo:DPOStage",
    "grpo": "recipeforge.stages.grpo:GRPOStage",
    "orpo": "recipeforge.stages.orpo:ORPOStage",
    "kto": "recipeforge.stages.kto:KTOStage",
    "cpo": "recipeforge.stages.cpo:CPOStage",
    "reward": "recipeforge.stages.reward:RewardStage",
}
# Backends that run their own training loop have runners of their own: (backend, stage) -> "module:class".
BACKEND_RUNNERS = {
    ("megatron", "pretrain"): "recipeforge.stages.megatron_lm:MegatronLMStage",
    ("megatron", "sft"): "recipeforge.stages.megatron_lm:MegatronLMStage",
}


def runner_class(stage: str, backend: str | None = None):
    """The runner class of `stage` (on `backend`, when that backend has a runner of its own)."""
    spec = BACKEND_RUNNERS.get((backend, stage)) or RUNNERS[stage]
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)
