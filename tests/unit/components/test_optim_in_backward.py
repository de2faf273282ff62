"""`InBackwardOptimizer`: per-parameter AdamW steps in the backward pass match one AdamW stepped after
it, under a learning-rate schedule; the gradients are freed as they are used; the logged norm is the
gradients'; the state dict restores a run."""

from __future__ import annotations

import copy

import pytest
import torch

from recipeforge.components.optim_in_backward import InBackwardOptimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _adamw(param: torch.nn.Parameter, name: str) -> torch.optim.Optimizer:
    return torch.optim.AdamW([{"params": [param], "weight_decay": 0.0 if name.endswith("bias") else 0.1}], lr=0.05)


def _schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(n)]


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def test_steps_in_backward_match_one_adamw_after_it():
    plain, hooked = _model(), _model()
    decay = [p for n, p in plain.named_parameters() if not n.endswith("bias")]
    no_decay = [p for n, p in plain.named_parameters() if n.endswith("bias")]
    reference = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=0.05)
    ref_schedule = _schedule(reference)
    fused = InBackwardOptimizer(hooked.named_parameters(), _adamw)
    schedule = _schedule(fused)
    for x, y in _batches(6):
        loss = _loss(plain, x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), float("inf"))
        reference.step()
        reference.zero_grad()
        ref_schedule.step()

        _loss(hooked, x, y).backward()  # every parameter steps here
        assert all(p.grad is None for p in hooked.parameters())  # freed as they were used
        assert fused.grad_norm() == pytest.approx(float(norm), rel=1e-5)
        fused.step()
        fused.zero_grad()
        schedule.step()
        assert fused.grad_norm() == 0.0
    for a, b in zip(plain.parameters(), hooked.parameters()):
        torch.testing.assert_close(a, b)
    # the schedule reached every per-parameter optimizer
    assert [g["lr"] for opt in fused.optimizers for g in opt.param_groups] == [pytest.approx(0.05 / 7)] * 4
    assert len(fused.optimizers) == 4


def test_state_dict_resumes_the_run():
    batches = _batches(6)
    straight = _model()
    opt = InBackwardOptimizer(straight.named_parameters(), _adamw)
    for x, y in batches:
        _loss(straight, x, y).backward()

    first = _model()
    opt1 = InBackwardOptimizer(first.named_parameters(), _adamw)
    for x, y in batches[:3]:
        _loss(first, x, y).backward()
    saved, weights = copy.deepcopy(opt1.state_dict()), copy.deepcopy(first.state_dict())
    opt1.remove_hooks()

    resumed = _model()
    resumed.load_state_dict(weights)
    opt2 = InBackwardOptimizer(resumed.named_parameters(), _adamw)
    opt2.load_state_dict(saved)
    for x, y in batches[3:]:
        _loss(resumed, x, y).backward()
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b)
    assert opt.state[next(straight.parameters())]["step"] == 6  # torch's view of the state by parameter


def test_a_state_of_another_model_is_refused():
    opt = InBackwardOptimizer(_model().named_parameters(), _adamw)
    with pytest.raises(ValueError, match="parameter names differ"):
        opt.load_state_dict({"in_backward": {"0.weight": {}}})
    with pytest.raises(ValueError, match="not saved with train.optimizer_in_backward"):
        opt.load_state_dict(torch.optim.SGD(_model().parameters(), lr=0.1).state_dict())


def test_frozen_parameters_get_no_optimizer():
    model = _model()
    model[0].weight.requires_grad_(False)
    opt = InBackwardOptimizer(model.named_parameters(), _adamw)
    assert opt.names == ["0.bias", "2.weight", "2.bias"]


def test_the_schedule_reaches_the_optimizers_after_a_state_is_loaded():
    """Accelerate's optimizer wrapper loads the state dict back on construction: the rates the
    scheduler sets must still be the ones the hooks step with."""
    model = _model()
    opt = InBackwardOptimizer(model.named_parameters(), _adamw)
    schedule = _schedule(opt)
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    for x, y in _batches(3):
        _loss(model, x, y).backward()
        schedule.step()
    assert [g["lr"] for o in opt.optimizers for g in o.param_groups] == [pytest.approx(0.05 / 4)] * 4
    assert opt.param_groups[0] is opt.optimizers[0].param_groups[0]
