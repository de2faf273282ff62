"""The optimizer step inside the backward pass (`train.optimizer_in_backward`).

Each trainable parameter gets an optimizer of its own, stepped by a post-accumulate-grad hook as soon
as backward has completed its gradient, which is then freed: the whole model's gradients never exist
at once (torchtune's `optimizer_in_bwd`, torch's "How to save memory by fusing the optimizer step
into the backward pass" tutorial). The Trainer is handed `InBackwardOptimizer`, one optimizer in
name: its `param_groups` are the per-parameter optimizers' own group dicts, so the Trainer's
learning-rate scheduler sets the rate every hook steps with; its `step` and `zero_grad` have nothing
left to do, and its state dict holds every per-parameter optimizer's (checkpoints and resume).
The gradient norm the Trainer logs is measured in the hooks, before each gradient is freed.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from transformers import Trainer


class InBackwardOptimizer(torch.optim.Optimizer):
    """One optimizer per parameter, stepped in the backward pass by hooks this object registers."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]],
                 make: Callable[[torch.nn.Parameter, str], torch.optim.Optimizer]) -> None:
        """`make(param, name)`: the optimizer of one parameter (its class, rate and weight decay)."""
        self.names: list[str] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self._handles: list[Any] = []
        self._squared_norm = 0.0
        for name, param in named_params:
            if not param.requires_grad:
                continue
            optimizer = make(param, name)
            self.names.append(name)
            self.optimizers.append(optimizer)
            hook = self._hook(optimizer)
            self._handles.append(param.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]
        if not self.optimizers:
            raise ValueError("no trainable parameters to step in the backward pass")
        first = self.optimizers[0]
        # torch.optim.Optimizer.__init__ would build groups of its own; the schedulers need only the
        # attributes set here (param_groups, defaults, state) and the hook registries below.
        self.defaults = dict(first.defaults)
        self.param_groups = [group for opt in self.optimizers for group in opt.param_groups]
        self.state = _StateView(self.optimizers)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._zero_grad_profile_name = "Optimizer.zero_grad#InBackwardOptimizer.zero_grad"

    def _hook(self, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
        def step_now(param: torch.Tensor) -> None:
            assert param.grad is not None  # the hook runs once the gradient is accumulated
            self._squared_norm += float(param.grad.detach().float().pow(2).sum())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # freed: the memory this option saves
        return step_now

    def grad_norm(self) -> float:
        """The norm of the gradients stepped since the last `step()` call (the Trainer's logged norm)."""
        return math.sqrt(self._squared_norm)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """Nothing to step: every parameter was stepped in backward. Starts the next norm."""
        self._squared_norm = 0.0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: each gradient was freed after its step."""

    def state_dict(self) -> dict[str, Any]:
        """Every per-parameter optimizer's state dict, by parameter name."""
        return {"in_backward": {name: opt.state_dict() for name, opt in zip(self.names, self.optimizers)}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore `state_dict()`'s states; a missing or unknown parameter name is an error."""
        saved = state_dict.get("in_backward")
        if not isinstance(saved, dict) or set(saved) != set(self.names):
            raise ValueError("the optimizer state was not saved with train.optimizer_in_backward for this model "
                             "(its parameter names differ)")
        for name, opt in zip(self.names, self.optimizers):
            opt.load_state_dict(saved[name])
        # torch's load_state_dict gives each optimizer new group dicts: share those, in the same list
        # (a scheduler built on this optimizer, and Accelerate's wrapper, which loads a state on
        # construction, must reach the groups the hooks step with)
        self.param_groups[:] = [group for opt in self.optimizers for group in opt.param_groups]

    def remove_hooks(self) -> None:
        """Detach the per-parameter hooks (the parameters train no further)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _StateView(defaultdict[torch.Tensor, Any]):
    """`optimizer.state` as torch's optimizers expose it: parameter -> its state (read only: each
    per-parameter optimizer keeps its own)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        super().__init__()
        self._optimizers = optimizers

    def __missing__(self, key: torch.Tensor) -> Any:
        for opt in self._optimizers:
            if key in opt.state:
                return opt.state[key]
        raise KeyError(key)


def attach(trainer: Trainer, cls_and_kwargs: tuple[type, dict[str, Any]] | None = None) -> InBackwardOptimizer:
    """Give `trainer` an `InBackwardOptimizer` over its model's trainable parameters: the optimizer
    class and keyword arguments the Trainer would use (`cls_and_kwargs`, else the Trainer's own for
    `args.optim`), with its weight-decay grouping; and log the norm the hooks measure."""
    model = trainer.model
    assert model is not None  # a built trainer holds its model
    cls, kwargs = cls_and_kwargs if cls_and_kwargs is not None else \
        trainer.get_optimizer_cls_and_kwargs(trainer.args, model)
    kwargs = dict(kwargs)
    decay = set(trainer.get_decay_parameter_names(model))

    def make(param: torch.nn.Parameter, name: str) -> torch.optim.Optimizer:
        group = {"params": [param], "weight_decay": trainer.args.weight_decay if name in decay else 0.0}
        made: torch.optim.Optimizer = cls([group], **kwargs)
        return made

    optimizer = InBackwardOptimizer(model.named_parameters(), make)
    trainer.optimizer = optimizer

    def logged_norm(model: torch.nn.Module, grad_norm: object = None) -> float:
        # Trainer._get_grad_norm would read the (already freed) gradients: 0
        return optimizer.grad_norm()

    trainer._get_grad_norm = logged_norm
    return optimizer
