"""Distributed backends behind one protocol (`backends.base.Backend`), in the ``backends`` registry.

Built-ins (single, ddp, deepspeed, fsdp, megatron) register exactly as a plugin would: a plugin
publishes an entry point in the group ``recipeforge.backends`` naming a class (or instance) with the
protocol's methods. Importing this package is cheap; torch, Accelerate, DeepSpeed and Megatron are
imported inside the methods that use them.
"""

from __future__ import annotations

from typing import Any

from recipeforge.backends.base import Backend, TrainerBackend
from recipeforge.backends.ddp import DDPBackend
from recipeforge.backends.deepspeed import DeepSpeedBackend
from recipeforge.backends.fsdp import FSDPBackend
from recipeforge.backends.megatron import MegatronBackend
from recipeforge.backends.single import SingleBackend
from recipeforge.registry import Registry

_METHODS = ("check", "launcher", "accelerate_config", "launch_files", "launch_env", "setup_worker",
            "trainer_kwargs", "save_final", "runtime_report")


def _as_backend(name: str, obj: Any) -> Backend:
    """A registered backend: an instance with the protocol's methods (a class is instantiated)."""
    if isinstance(obj, type):
        obj = obj()
    missing = [m for m in _METHODS if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(f"backend '{name}' lacks {', '.join(missing)} (see recipeforge.backends.base.Backend)")
    return obj


backends: Registry[Backend] = Registry("backends", coerce=_as_backend)
for _cls in (SingleBackend, DDPBackend, DeepSpeedBackend, FSDPBackend, MegatronBackend):
    backends.register(_cls.name, _cls)


def get_backend(name: str) -> Backend:
    """The backend called `name` (built in, or from a plugin's entry point)."""
    return backends.get(name, key="distributed.backend")


__all__ = ["Backend", "TrainerBackend", "backends", "get_backend"]
