"""Rules of `train.optimizer_in_backward`: the settings a per-parameter optimizer step inside the
backward pass cannot honour, each refused at the key with the change that makes it work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from recipeforge.config.schema.problems import RuleProblem

if TYPE_CHECKING:
    from recipeforge.config.schema.recipe import Recipe

KEY = ("train", "optimizer_in_backward")
# The backends where one process holds the whole model and torch's autograd owns the gradients.
ONE_PROCESS_BACKENDS = ("auto", "single")


def in_backward_problems(r: Recipe) -> Iterator[RuleProblem]:
    """What `train.optimizer_in_backward: true` cannot work with in `r` (nothing when it is off)."""
    t = r.train
    if not t.optimizer_in_backward:
        return
    if t.max_grad_norm is not None:
        yield RuleProblem(KEY, f"gradient clipping (train.max_grad_norm: {t.max_grad_norm}) scales every gradient "
                               "by the norm of all of them, and with the optimizer step in the backward pass each "
                               "parameter is updated as soon as its own gradient is complete",
                          "set train.max_grad_norm: null, or train.optimizer_in_backward: false")
    if isinstance(t.micro_batch_size, int) and t.micro_batch_size != t.global_batch_size:
        yield RuleProblem(KEY, f"gradient accumulation ({t.global_batch_size} sequences per step in micro batches "
                               f"of {t.micro_batch_size}) needs the gradients of every micro batch kept until the "
                               "step, and with the optimizer step in the backward pass each gradient is used and "
                               "freed in the micro batch that made it",
                          f"set train.micro_batch_size: {t.global_batch_size} (or micro_batch_size: auto), or "
                          f"train.global_batch_size: {t.micro_batch_size}")
    if r.model.dtype == "fp16":
        yield RuleProblem(KEY, "fp16 training scales the loss and unscales every gradient together before the "
                               "optimizer step, which the step in the backward pass cannot wait for",
                          "set model.dtype: bf16 (or fp32), or train.optimizer_in_backward: false")
    if r.distributed.backend not in ONE_PROCESS_BACKENDS:
        yield RuleProblem(KEY, f"the optimizer step in the backward pass needs one process that holds the whole "
                               f"model and its gradients, and distributed.backend is {r.distributed.backend} "
                               "(data-parallel gradients are reduced after the backward pass; sharding engines "
                               "own the optimizer step)",
                          "set distributed.backend: single (or auto), or train.optimizer_in_backward: false")
