"""`train.precision` and `train.tf32` in the plan: fp32 master weights when they fit, pure bf16 when only
that fits on one GPU, the memory model counting each the way the Trainer runs it, and refusals of
pinned settings a run cannot honour."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.hardware import GIB

SFT = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny" / "sft-full.yaml"
QWEN_1_5B = "model.name_or_path=Qwen/Qwen2.5-1.5B"


def _plan(hw: str | None, *overrides: str):
    recipe = load_recipe(SFT, overrides=list(overrides)).recipe
    return make_plan(recipe, parse_hardware(hw) if hw else None)


def _params(plan) -> int:
    return plan.extra.model["params"]


def test_auto_keeps_fp32_master_weights_when_they_fit():
    plan = _plan("1xH100-80GB", QWEN_1_5B)
    choice = plan.reasons["precision"]
    assert (plan.backend, choice.value) == ("single", "mixed")
    assert "fp32 master weights fit" in choice.reason
    n = _params(plan)
    # fp32 weights and gradients, two fp32 AdamW states, and the bf16 copies autocast saves for backward
    assert plan.memory_gb["weights"] == pytest.approx(4 * n / GIB, abs=0.01)
    assert plan.memory_gb["gradients"] == pytest.approx(4 * n / GIB, abs=0.01)
    assert plan.memory_gb["optimizer"] == pytest.approx(8 * n / GIB, abs=0.01)
    assert plan.memory_gb["autocast_weights"] > 0
    assert "fp32 weights with bf16 autocast" in plan.extra.precision


def test_auto_falls_back_to_pure_bf16_when_masters_need_offload():
    plan = _plan("1xL4-24GB", QWEN_1_5B)
    choice = plan.reasons["precision"]
    assert (plan.backend, plan.offload, choice.value) == ("single", "none", "pure_bf16")
    assert "needs CPU offload" in choice.reason and "pure_bf16_sr" in choice.reason
    n = _params(plan)
    assert plan.memory_gb["weights"] == pytest.approx(2 * n / GIB, abs=0.01)
    assert plan.memory_gb["optimizer"] == pytest.approx(4 * n / GIB, abs=0.01)  # AdamW states in bf16
    assert "autocast_weights" not in plan.memory_gb
    # pinned mixed on the same GPU needs offload instead
    assert _plan("1xL4-24GB", QWEN_1_5B, "train.precision=mixed").offload != "none"


def test_sharded_backends_and_adapters_keep_their_own_masters():
    plan = _plan("8xH100-80GB", "model.name_or_path=meta-llama/Llama-3.1-8B", "train.global_batch_size=64")
    assert plan.backend != "single" and plan.reasons["precision"].value == "mixed"
    assert "keeps fp32 master weights" in plan.reasons["precision"].reason
    lora = _plan("1xH100-80GB", QWEN_1_5B, "adapter.type=lora")
    assert lora.reasons["precision"].value == "mixed" and "peft" in lora.reasons["precision"].reason


def test_pinned_pure_bf16_that_cannot_apply_is_refused():
    with pytest.raises(RecipeError, match="applies to one GPU or DDP") as err:
        _plan("8xH100-80GB", QWEN_1_5B, "train.precision=pure_bf16", "distributed.backend=deepspeed",
              "train.global_batch_size=64")
    assert err.value.problems[0].key == "train.precision"
    with pytest.raises(RecipeError, match="peft trains the adapter in fp32"):
        _plan("1xH100-80GB", QWEN_1_5B, "adapter.type=lora", "train.precision=pure_bf16")
    with pytest.raises(RecipeError, match="resolves to fp32"):
        _plan(None, "train.precision=pure_bf16")  # the CPU: auto dtype is fp32
    with pytest.raises(RecipeError, match="torchao's AdamW"):
        _plan("1xH100-80GB", QWEN_1_5B, "train.precision=pure_bf16_sr", "train.optimizer=sgd")
    with pytest.raises(RecipeError, match="no bf16 autocast on the CPU"):
        _plan(None, "model.dtype=bf16", "train.precision=mixed")


def test_cpu_plans_train_in_the_model_dtype():
    assert _plan(None).reasons["precision"].value == "fp32"
    assert _plan(None, "model.dtype=bf16").reasons["precision"].value == "pure_bf16"
    assert "tf32" not in _plan(None).reasons  # nothing to decide off CUDA


def test_tf32_reason_follows_the_gpu_generation():
    assert _plan("1xH100-80GB", QWEN_1_5B).reasons["tf32"].value is True
    v100 = _plan("1xV100-32GB", QWEN_1_5B).reasons["tf32"]
    assert v100.value is False and "not Ampere" in v100.reason
    assert _plan("1xH100-80GB", QWEN_1_5B, "train.tf32=false").reasons["tf32"].value is False
