"""The plan for the processes a launch really starts (`plan_for_world`), and what a finished plan
says about them (`processes_per_node`, `check_world`).

On GPUs the planner already plans every GPU of the target; this module only narrows the target to
what the command line or the launcher says (``--nnodes``, ``--nproc-per-node``, or the WORLD_SIZE a
launcher such as torchrun set) and refuses contradictions.

On a CPU-only target the planner plans one process. A multi-process CPU run (gloo) is asked for with
``--nproc-per-node N`` (and ``--nnodes``), or by starting recipeforge under a launcher. The plan is then
re-derived for that world here, so the plan stays the one place where world size and batch math
live: ``micro_batch_size x gradient_accumulation x data_parallel == train.global_batch_size``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.capabilities import parallel_key, refusals
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import Hardware, hardware_for
from recipeforge.plan.plan import make_plan
from recipeforge.plan.planners import Planners
from recipeforge.plan.cpu_spread import spread_over_cpus
from recipeforge.plan.trust import annotate_plan
from recipeforge.plan.types import Plan

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.recipe import Recipe


def plan_for_world(recipe: Recipe, *, nnodes: int | None = None, nproc_per_node: int | None = None,
                   hardware: Hardware | None = None, planners: Planners | None = None) -> Plan:
    """Plan `recipe` for `nnodes` x `nproc_per_node` processes (None: what the target says) with the
    backends of `planners` (default: the installed ones), with the code-trust decision and the
    plugins it uses recorded in the plan."""
    planners = planners if planners is not None else Planners.installed()
    plan = _plan_for_world(recipe, nnodes=nnodes, nproc_per_node=nproc_per_node, hardware=hardware,
                           planners=planners)
    return annotate_plan(plan, recipe)


def _plan_for_world(recipe: Recipe, *, nnodes: int | None, nproc_per_node: int | None, hardware: Hardware | None,
                    planners: Planners) -> Plan:
    hw = hardware if hardware is not None else hardware_for(recipe, None)
    if nproc_per_node is not None and nproc_per_node < 1:
        raise RecipeError(f"--nproc-per-node must be >= 1 (got {nproc_per_node})")
    if hw.device == "cuda":
        return make_plan(recipe, _gpu_target(hw, nnodes, nproc_per_node), planners)
    nodes = nnodes or hw.nodes
    per_node = nproc_per_node or 1
    world = nodes * per_node
    d = recipe.distributed
    if d.backend != "auto":
        # Whether the pinned backend runs on the CPU, with this many processes and the parallel sizes the
        # recipe pins: its capability record.
        found = refusals(planners.capabilities(d.backend), device="cpu", cpu_processes=world,
                         model_parallel=_cpu_parallel_key(d))
        if found:
            raise found[0].error()
    _check_cpu_expert_parallel(d, world)
    if world == 1:
        return make_plan(recipe, hw, planners)
    # The planner sizes one CPU process; plan that, then spread it over the world: memory per
    # process only shrinks when the batch is split.
    base = make_plan(recipe, hw, planners)
    return spread_over_cpus(base, recipe, nodes=nodes, per_node=per_node, planners=planners)


def _cpu_parallel_key(d: DistributedConfig) -> str | None:
    """The first parallel size above 1 the recipe pins, replicas included (a CPU job is one mesh of
    shards, `data_parallel_shard` being every data-parallel process)."""
    return parallel_key(d.tensor_parallel, d.pipeline_parallel, d.context_parallel) or \
        ("expert_parallel" if (d.pinned_size("expert_parallel") or 1) > 1 else None) or \
        ("data_parallel_replicate" if (d.pinned_size("data_parallel_replicate") or 1) > 1 else None)


def _check_cpu_expert_parallel(d: DistributedConfig, world: int) -> None:
    """A pinned expert-parallel size on the CPU splits the experts over that many of the job's processes
    (transformers' ``ep_size``, which must divide the data-parallel processes); refuse a world it does not
    fit, and tensor parallel beside it (on the CPU each runs alone)."""
    ep = d.pinned_size("expert_parallel") or 1
    if ep <= 1:
        return
    if world % ep:
        raise RecipeError(f"expert parallel {ep} splits the experts over {ep} processes, and this CPU job has "
                          f"{world}", key="distributed.expert_parallel",
                          hint=f"train with --nproc-per-node {ep} (or a multiple of it), or set "
                               "distributed.expert_parallel: 1")
    if (d.pinned_size("tensor_parallel") or 1) > 1:
        raise RecipeError("expert parallel and tensor parallel together are not run on the CPU",
                          key="distributed.expert_parallel",
                          hint="set distributed.tensor_parallel: 1, or distributed.expert_parallel: 1")


def _gpu_target(hw: Hardware, nnodes: int | None, nproc_per_node: int | None) -> Hardware:
    if nnodes is not None and nnodes != hw.nodes:
        # The command line wins, as every flag does: the probe sees one machine of a job that spans
        # several, and a recipe's hardware.nodes (or its default of 1) describes one job shape of many.
        # (`--hardware 2x8xA100-80GB --nnodes 3`, two flags that disagree, is refused by the CLI.)
        hw = replace(hw, nodes=nnodes)
    if nproc_per_node is not None and nproc_per_node != hw.gpus_per_node:
        if nproc_per_node > hw.gpus_per_node:
            raise RecipeError(f"{nproc_per_node} processes per node asked for, but the target has "
                              f"{hw.gpus_per_node} GPU(s) per node", key="hardware.gpus_per_node",
                              hint="one process drives one GPU")
        hw = replace(hw, gpus_per_node=nproc_per_node)
    return hw


def processes_per_node(plan: Plan) -> int:
    """Processes each node's launcher starts."""
    if plan.device == "cuda":
        return plan.gpus_per_node
    if plan.extra.processes_per_node is not None:
        return plan.extra.processes_per_node
    return max(1, plan.world_size // max(1, plan.nodes))


def check_world(plan: Plan, world_size: int) -> None:
    """A launched job must have exactly the processes its plan was made for."""
    if plan.world_size != world_size:
        raise RecipeError(f"the launcher started {world_size} processes but the plan is for {plan.world_size}",
                          key="distributed",
                          hint="start `recipeforge train` without a launcher (it launches the plan's processes), "
                               "or make the launcher's process count match the recipe's hardware")
