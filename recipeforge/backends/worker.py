"""Inside a launched worker: the process group, the plan every rank agrees on, and barriers.

A worker started by `recipeforge train`'s launcher reads the plan file its worker spec names
(`worker_spec.WorkerSpec`).
A worker started directly (``torchrun -m recipeforge train x.yaml``) has no plan yet: rank 0 plans for
the launcher's world and sends its plan to the others, so every rank runs rank 0's plan. Either way
rank 0's plan is broadcast and compared, so nodes that disagree stop with a clear error instead of
training with different batch splits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from recipeforge.errors import Problem, RecipeError

if TYPE_CHECKING:
    from datetime import timedelta

    from recipeforge.config.schema import Recipe
    from recipeforge.plan.types import Plan
    from recipeforge.plan.planners import Planners
    from recipeforge.stages.context import DistInfo

T = TypeVar("T")

# Plan fields every rank must agree on (memory figures may differ by a node's probed RAM).
AGREE = ("backend", "preset", "device", "world_size", "data_parallel", "tensor_parallel", "pipeline_parallel",
         "micro_batch_size", "gradient_accumulation", "global_batch_size", "offload", "backend_part")


def read_plan(path: Path) -> "Plan":
    """A `Plan` from its JSON file."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot read the launch plan {path}: {exc}",
                          hint="start the run with `recipeforge train` (it writes the plan before launching)") from None
    return plan_from_dict(raw)


def launched_plan(path: Path, world_size: int, timeout_minutes: float | None = None) -> "Plan":
    """The plan a worker runs: read from `path`; with more than one process, the process group joined
    and rank 0's plan agreed by every rank; checked against the world it runs in."""
    from recipeforge.plan.world import check_world

    plan = read_plan(path)
    if world_size > 1:
        init_process_group(plan.device, timeout_minutes)
        plan = agreed_plan(plan)
    check_world(plan, world_size)
    return plan


def group_plan(recipe: "Recipe", dist_info: "DistInfo") -> "Plan":
    """A group started without a spec (``torchrun -m recipeforge train``): the process group joined,
    rank 0's plan for the launcher's world agreed by every rank and checked against it."""
    from recipeforge.plan.world import check_world, plan_for_world

    init_process_group(worker_device(recipe), recipe.distributed.timeout_minutes)
    nnodes, per_node = launched_world()
    plan = agreed_plan(on_main(lambda: plan_for_world(recipe, nnodes=nnodes, nproc_per_node=per_node), dist_info))
    check_world(plan, dist_info.world_size)
    return plan


def plan_from_dict(raw: dict[str, Any], planners: "Planners | None" = None) -> "Plan":
    """A `Plan` from its `to_dict()` form; its backend's spec from `planners` (default: the installed
    backends) reads the backend's part and gives the plan its traits."""
    from dataclasses import replace

    from recipeforge.plan.planners import Planners
    from recipeforge.plan.types import Choice, Plan, PlanExtras

    raw = dict(raw)
    raw["reasons"] = {k: Choice(**v) if isinstance(v, dict) else v for k, v in raw.get("reasons", {}).items()}
    raw["extra"] = PlanExtras.from_dict(raw.get("extra"))
    raw.pop("traits", None)
    spec = (planners if planners is not None else Planners.installed()).spec(raw["backend"])
    raw["backend_part"] = spec.part_from_dict(raw.get("backend_part") or {})
    plan = Plan(**raw)
    return replace(plan, traits=spec.traits(plan))


def init_process_group(device: str, timeout_minutes: float | None = None) -> None:
    """Join the launcher's process group (NCCL on GPUs, gloo on the CPU) before anything else, so the
    run directory, the data cache and the plan can be coordinated with barriers.

    `timeout_minutes` (`distributed.timeout_minutes`) bounds every collective wait; without it torch's
    default applies (10 minutes for NCCL), which a long wait on one rank would run into."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    from recipeforge.backends.elastic import attempt_store_kwargs

    kwargs: dict[str, Any] = {"timeout": process_group_timeout(timeout_minutes)} if timeout_minutes else {}
    kwargs.update(attempt_store_kwargs(kwargs.get("timeout")))  # a restarted worker group: fresh keys
    dist.init_process_group(backend="nccl" if device == "cuda" else "gloo", **kwargs)


def process_group_timeout(minutes: float) -> timedelta:
    """`distributed.timeout_minutes` as the `timedelta` torch.distributed takes."""
    from datetime import timedelta

    return timedelta(minutes=minutes)


def barrier() -> None:
    """Wait for every process (no-op outside a process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def finish() -> None:
    """End a worker's run together: wait until every rank (the main one writing final/, the merge and
    the model card) is done, then leave the process group. A rank that simply exited while others
    still worked would tear its communication threads down mid-run, abort, and make the launcher stop
    the whole job."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def broadcast(obj: T, *, src: int = 0) -> T:
    """Rank `src`'s `obj` on every rank (any picklable object)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def on_main(fn: Callable[[], T], dist_info: DistInfo, *, local: bool = False) -> T | None:
    """Run `fn` on rank 0 (with `local`: on each machine's first rank) while the others wait; returns
    its result there, None elsewhere. A failure is shared, so no rank is left waiting at a barrier:
    the failing rank re-raises its error, the others stop with a `RecipeError` saying who failed."""
    import torch.distributed as dist

    here = dist_info.local_rank == 0 if local else dist_info.is_main
    result: T | None = None
    failure: list[Problem] | str | None = None
    error: BaseException | None = None
    if here:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - shared with the other ranks, then re-raised
            error = exc
            failure = exc.problems if isinstance(exc, RecipeError) else f"{type(exc).__name__}: {exc}"
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return result
    failures: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, (dist.get_rank(), failure))
    if error is not None:
        raise error
    failed = [(rank, f) for rank, f in failures if f is not None]
    if failed:
        rank, f = failed[0]
        if isinstance(f, list):
            raise RecipeError(f)  # the same user error, reported by every rank
        raise RecipeError(f"rank {rank} failed while the others waited: {f}")
    return result


def agreed_plan(plan: "Plan | None") -> "Plan":
    """Rank 0's plan on every rank; a rank whose own plan differs in a training-relevant field raises."""
    mine = plan.to_dict() if plan is not None else None
    ref = broadcast(mine)
    assert ref is not None  # rank 0 has planned (`on_main` ran the planner there)
    if mine is not None:
        diff = [k for k in AGREE if mine.get(k) != ref.get(k)]
        if diff:
            raise RecipeError("the nodes of this job planned differently: " +
                              ", ".join(f"{k} {mine.get(k)} here, {ref.get(k)} on rank 0" for k in diff),
                              key="hardware", hint="give every node the same recipe, overrides and launch flags")
    return plan_from_dict(ref)


def launched_world() -> tuple[int, int]:
    """(nodes, processes per node) of the launcher that started this worker."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, world // max(1, local)), local


def worker_device(recipe: Recipe) -> str:
    """cuda or cpu, decided without a plan (a directly launched worker needs it to join the group)."""
    from recipeforge.plan import hardware_for

    return hardware_for(recipe, None).device
