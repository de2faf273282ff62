"""Distributed backends, one `backends.base.BackendSpec` each, in the ``backends`` registry.

Built-ins register exactly as a plugin would: a plugin publishes an entry point in the group
``recipeforge.backends`` naming a `BackendSpec` subclass (or instance). Importing this package is cheap; torch, Accelerate, DeepSpeed and Megatron are
imported inside the methods that use them.
"""

from __future__ import annotations

from recipeforge.backends.base import Backend, BackendSpec
from recipeforge.backends.ddp import DDPBackend
from recipeforge.backends.deepspeed import DeepSpeedBackend
from recipeforge.backends.fsdp import FSDPBackend
from recipeforge.backends.megatron import MegatronBackend
from recipeforge.backends.single import SingleBackend
from recipeforge.registry import Registry

_METHODS = ("check", "launcher", "accelerate_config", "launch_files", "launch_env", "setup_worker",
            "trainer_kwargs", "save_final", "runtime_report")


def _as_backend(name: str, obj: object) -> BackendSpec:
    """A registered backend: a `BackendSpec` instance (a class is instantiated) named as registered."""
    if isinstance(obj, type):
        obj = obj()
    if not isinstance(obj, BackendSpec):
        missing = [m for m in _METHODS if not callable(getattr(obj, m, None))]
        raise TypeError(f"backend '{name}' is not a recipeforge.backends.base.BackendSpec"
                        + (f" (it lacks {', '.join(missing)})" if missing else ""))
    if obj.name != name:
        raise TypeError(f"backend '{name}' calls itself '{obj.name}': the entry point's name and the spec's "
                        "`name` must agree")
    return obj


backends: Registry[BackendSpec] = Registry("backends", coerce=_as_backend)
for _cls in (SingleBackend, DDPBackend, DeepSpeedBackend, FSDPBackend, MegatronBackend):
    backends.register(_cls.name, _cls)


def get_backend(name: str) -> BackendSpec:
    """The backend called `name` (built in, or from a plugin's entry point)."""
    return backends.get(name, key="distributed.backend")


__all__ = ["Backend", "BackendSpec", "backends", "get_backend"]
