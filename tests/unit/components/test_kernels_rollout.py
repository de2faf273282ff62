"""Kernels are never switched on where they cannot run; rollout engines come from a registry."""

from __future__ import annotations

import pytest

from recipeforge.components.kernels import apply_kernels
from recipeforge.components.rollout import rollout_arguments, rollout_engines
from recipeforge.config.schema import RolloutConfig
from recipeforge.errors import RecipeError


def test_gpu_kernels_are_skipped_on_cpu():
    notes = []
    effects = apply_kernels({"liger": {}, "flash_attn": {}, "torch_compile": {"mode": "default"}}, "cpu",
                            log=notes.append)
    assert effects.enabled == ["torch_compile"]
    assert set(effects.skipped) == {"liger", "flash_attn"} and len(notes) == 2
    assert effects.trainer_kwargs == {"torch_compile": True, "torch_compile_mode": "default"}


def test_unknown_kernel():
    with pytest.raises(RecipeError, match="unknown kernel"):
        apply_kernels({"ligerr": {}}, "cpu")


def test_hf_rollout_engine():
    assert "hf" in rollout_engines.names()
    assert rollout_arguments(RolloutConfig(), "cpu") == {"use_vllm": False}


def test_unknown_rollout_engine(builtins_only):
    with pytest.raises(RecipeError) as info:
        rollout_arguments(RolloutConfig(engine="vllm"), "cpu")
    (p,) = info.value.problems
    assert p.key == "grpo.rollout.engine" and "available: hf" in p.hint
