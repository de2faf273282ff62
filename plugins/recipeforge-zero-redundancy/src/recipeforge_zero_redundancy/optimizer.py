"""`ShardedOptimizer`: torch's `ZeroRedundancyOptimizer` as a transformers Trainer and Accelerate use it.

Imports torch: loaded by the worker only (the backend module stays light for `validate` and `plan`).
"""

from __future__ import annotations

import inspect

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedOptimizer(ZeroRedundancyOptimizer):
    """A `ZeroRedundancyOptimizer` whose state can be read before its first step.

    Accelerate reads and reloads an optimizer's state when it wraps it (to place it on the device).
    Before the first step there is no state to consolidate, so the empty global state is returned;
    after it, the state must be consolidated first (`consolidate_state_dict`), as torch requires."""

    def state_dict(self):
        if not self._all_state_dicts and not any(self.optim.state.values()):
            return torch.optim.Optimizer.state_dict(self)
        return super().state_dict()


def sharded(inner: torch.optim.Optimizer) -> ShardedOptimizer:
    """`inner` (a torch optimizer with its parameter groups) as a `ShardedOptimizer` of the same class,
    hyperparameters and groups (weight decay per group included)."""
    # `defaults` may hold derived keys the constructor does not take (AdamW's decoupled_weight_decay)
    accepted = inspect.signature(type(inner).__init__).parameters
    defaults = {k: v for k, v in inner.defaults.items() if k in accepted}
    groups = [{k: v for k, v in group.items() if k == "params" or k in accepted} for group in inner.param_groups]
    return ShardedOptimizer(groups, optimizer_class=type(inner), **defaults)


def is_sharded(optimizer) -> bool:
    """Whether `optimizer` shards its states over the ranks."""
    return isinstance(optimizer, ZeroRedundancyOptimizer)
