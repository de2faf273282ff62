"""Optimizer-state bytes of torchao's low-bit AdamW against a real optimizer's states (its first step
compiles kernels; the planner's figures alone: tests/unit/plan/test_plan_low_bit_optimizers.py)."""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.plan.memory import optimizer_state_bytes


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
