"""Optimizer-state bytes of torchao's low-bit AdamW: the planner's figure, a real optimizer's states,
and what a plan shows."""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.plan import make_plan
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.memory import optimizer_state_bytes


def test_state_bytes_per_parameter():
    assert optimizer_state_bytes("adamw_torchao_8bit", 4, 4096) == pytest.approx(2 * (1 + 4 / 256))
    assert optimizer_state_bytes("adamw_torchao_4bit", 4, 4096) == pytest.approx(2 * (0.5 + 4 / 256))


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
@pytest.mark.parametrize("name, cls", [("adamw_torchao_8bit", "AdamW8bit"), ("adamw_torchao_4bit", "AdamW4bit")])
def test_planned_bytes_equal_a_real_optimizers_states(name, cls):
    import torch
    import torchao.optim

    param = torch.nn.Parameter(torch.randn(64, 1024))
    # block size 256: what transformers' `adamw_torch_8bit` / `adamw_torch_4bit` pass to torchao
    opt = getattr(torchao.optim, cls)([param], lr=1e-3, block_size=256)
    param.grad = torch.randn_like(param)
    opt.step()
    state = opt.state[param]
    held = sum(t.numel() * t.element_size() for key in ("exp_avg", "exp_avg_sq")
               for t in (state[key].codes, state[key].scale))
    assert held / param.numel() == pytest.approx(optimizer_state_bytes(name, 4, 1024))


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
