"""Optimizer-state bytes of torchao's low-bit AdamW: the planner's figure and what a plan shows (a
real optimizer's states: tests/commands/test_plan_low_bit_optimizers.py)."""

from __future__ import annotations


import pytest

from recipeforge.plan import make_plan
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.memory import optimizer_state_bytes


def test_state_bytes_per_parameter():
    assert optimizer_state_bytes("adamw_torchao_8bit", 4, 4096) == pytest.approx(2 * (1 + 4 / 256))
    assert optimizer_state_bytes("adamw_torchao_4bit", 4, 4096) == pytest.approx(2 * (0.5 + 4 / 256))


def test_plan_shows_the_smaller_optimizer_states(recipe):
    gpu = parse_hardware("1xH100-80GB")
    pins = {"backend": "single"}
    plans = {opt: make_plan(recipe("meta-llama/Llama-3.2-1B", train={"optimizer": opt}, distributed=pins), gpu)
             for opt in ("adamw", "adamw_8bit", "adamw_torchao_8bit", "adamw_torchao_4bit")}
    gb = {opt: p.memory_gb["optimizer"] for opt, p in plans.items()}
    params = plans["adamw"].extra.model["params"]
    assert gb["adamw_torchao_8bit"] == pytest.approx(params * 2 * (1 + 4 / 256) / 2**30, abs=0.01)
    assert gb["adamw_torchao_4bit"] == pytest.approx(params * 2 * (0.5 + 4 / 256) / 2**30, abs=0.01)
    assert gb["adamw_torchao_4bit"] < gb["adamw_torchao_8bit"] < gb["adamw"] / 3
