"""A CPU job of several gloo processes: the one-process plan spread over them (the planner sizes one CPU
process; memory per process only shrinks when the batch is split), with the backend that runs that many
processes, the data-parallel size, the batch split and their reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError
from recipeforge.plan.candidates import auto_cpu_backends
from recipeforge.plan.parallel_layouts import runs_device_mesh
from recipeforge.plan.types import BackendPart, Choice, Plan
from recipeforge.stage_specs import stage_spec

if TYPE_CHECKING:
    from recipeforge.config.schema.distributed import DistributedConfig
    from recipeforge.config.schema.recipe import Recipe
    from recipeforge.config.schema.train import TrainConfig
    from recipeforge.plan.backend_spec import CpuSpread
    from recipeforge.plan.planners import Planners


def spread_over_cpus(base: Plan, recipe: Recipe, *, nodes: int, per_node: int, planners: Planners) -> Plan:
    """The one-process CPU plan `base` spread over `nodes` x `per_node` gloo processes: the backend that runs
    them, the data-parallel size, the batch split and the reasons for each."""
    d = recipe.distributed
    world = nodes * per_node
    # auto: the one-process plan's backend when it runs several processes (e.g. DeepSpeed for a pinned
    # offload), else the first CPU backend that does (replicas: DDP)
    backend = d.backend if d.backend != "auto" else _spreading_backend(base.backend, world, planners)
    spec = planners.spec(backend)
    spread = spec.cpu_spread(d)
    tp = spread.tensor_parallel
    dp = _cpu_data_parallel(d, runs_device_mesh(planners.capabilities(backend)), world, tp)
    micro, micro_reason, accumulation = _cpu_batch_split(recipe.train, base, dp, recipe.stage)
    where = f"{world} CPU processes ({nodes} node(s) x {per_node}, gloo)"
    reasons = _spread_reasons(base, recipe, backend, spread, where, dp)
    reasons["micro_batch_size"] = Choice(micro, micro_reason)
    reasons["gradient_accumulation"] = Choice(accumulation, f"global batch {recipe.train.global_batch_size} / "
                                                            f"(micro batch {micro} x {dp} data-parallel ranks)")
    reasons.update(_spread_state_reasons(d, spread))
    extra = replace(base.extra, processes_per_node=per_node,
                    warnings=[*base.extra.warnings,
                              "memory figures are the one-process estimate; sharding only lowers them"])
    plan = replace(base, backend=backend, preset=spread.preset, nodes=nodes, gpus_per_node=0, world_size=world,
                   data_parallel=dp, tensor_parallel=tp, pipeline_parallel=1, micro_batch_size=micro,
                   gradient_accumulation=accumulation, global_batch_size=micro * accumulation * dp,
                   offload=spread.offload, backend_part=spread.part if spread.part is not None else BackendPart(),
                   reasons=reasons, extra=extra)
    return replace(plan, traits=spec.traits(plan))  # the spreading backend's, not the base's


def _cpu_data_parallel(d: DistributedConfig, device_mesh: bool, world: int, tp: int) -> int:
    """The data-parallel size of a CPU job of `world` processes in groups of `tp` tensor-parallel
    ranks; refuses a tensor-parallel or pinned shard size that does not fit that world. `device_mesh`:
    the backend shards over one mesh of every data-parallel process (`runs_device_mesh`)."""
    if world % tp:
        raise RecipeError(f"tensor_parallel {tp} does not divide the {world} processes",
                          key="distributed.tensor_parallel",
                          hint=f"use --nproc-per-node a multiple of {tp}, or another tensor_parallel")
    dp = world // tp
    shard = d.pinned_size("data_parallel_shard")
    if device_mesh and shard is not None and shard != dp:
        raise RecipeError(f"data_parallel_shard {shard} is not the {dp} data-parallel processes of this CPU job",
                          key="distributed.data_parallel_shard",
                          hint=f"on the CPU every data-parallel process shards the model: set it to auto or {dp}")
    return dp


def _cpu_batch_split(t: TrainConfig, base: Plan, dp: int, stage: str) -> tuple[int, str, int]:
    """(micro batch, its reason, gradient accumulation) of the global batch over `dp` processes; a
    micro batch below the stage's least (`StageSpec.min_micro_batch`) is refused."""
    global_batch = t.global_batch_size
    if global_batch % dp:
        raise RecipeError(f"global batch {global_batch} cannot be split over {dp} data-parallel processes",
                          key="train.global_batch_size",
                          hint=f"use a multiple of {dp} (e.g. {dp * max(1, round(global_batch / dp))})")
    per_rank = global_batch // dp
    if isinstance(t.micro_batch_size, int):
        micro = t.micro_batch_size
        if per_rank % micro:
            raise RecipeError(f"global batch {global_batch} is not a multiple of micro batch {micro} x {dp} "
                              "data-parallel processes", key="train.micro_batch_size",
                              hint=f"use micro_batch_size: auto, or a divisor of {per_rank}")
        micro_reason = "recipe sets it"
    else:
        # The single-process plan's micro batch fits in memory; any smaller one does too.
        micro = max(b for b in range(1, min(per_rank, base.micro_batch_size) + 1) if per_rank % b == 0)
        micro_reason = (f"auto: largest divisor of the per-process batch {per_rank} that is at most the "
                        f"single-process choice {base.micro_batch_size}")
    spec = stage_spec(stage)
    if micro < spec.min_micro_batch:
        least = spec.min_micro_batch
        raise RecipeError(f"{spec.needs_rows}; a global batch of {global_batch} over {dp} data-parallel "
                          f"processes leaves {per_rank} row(s) per process", key="train.global_batch_size",
                          hint=f"use a global batch of {least * dp} or more (a multiple of {dp}), or fewer processes")
    return micro, micro_reason, per_rank // micro


def _spread_reasons(base: Plan, recipe: Recipe, backend: str, spread: CpuSpread, where: str,
                    dp: int) -> dict[str, Choice]:
    """The one-process plan's reasons with the backend, preset and parallel sizes of the CPU job."""
    d = recipe.distributed
    preset, tp = spread.preset, spread.tensor_parallel
    # Replacing a key keeps its place: the reasons print in the one-process plan's order.
    reasons = dict(base.reasons)
    reasons["backend"] = Choice(backend, f"recipe pins it; {where}" if d.backend == backend
                                else f"auto: replicas on {where}")
    reasons["preset"] = Choice(preset, "from the recipe's distributed settings" if preset else "none for DDP")
    reasons["data_parallel"] = Choice(dp, f"{where}, from --nproc-per-node / the launcher"
                                      + (f", in groups of {tp} tensor-parallel ranks" if tp > 1 else ""))
    if tp > 1:
        reasons["tensor_parallel"] = Choice(tp, "recipe pins it (transformers' tensor-parallel plan, gloo)")
    return reasons


def _spread_state_reasons(d: DistributedConfig, spread: CpuSpread) -> dict[str, Choice]:
    """Sharding, ZeRO stage and offload of the CPU job's backend."""
    zero, offload, sharding = spread.zero_stage, spread.offload, spread.fsdp_sharding
    reasons: dict[str, Choice] = {}
    if sharding is not None:
        reasons["fsdp_sharding"] = Choice(sharding, "from the preset" if d.preset else
                                          "recipe's distributed.fsdp_sharding (hybrid is full sharding on one machine)")
    reasons["zero_stage"] = Choice(zero, "from the preset" if d.preset else
                                   ("recipe pins it" if d.zero_stage != "auto" else
                                    ("auto: ZeRO-2 (memory is not the constraint on the CPU)" if zero is not None
                                     else "not DeepSpeed")))
    reasons["offload"] = Choice(offload, "recipe pins it" if offload != "none" else "not needed")
    return reasons


def _spreading_backend(planned: str, world: int, planners: Planners) -> str:
    """The backend a CPU job of `world` processes runs in auto mode: the one-process plan's, when it
    runs that many processes, else the first CPU backend (`cpu_preference`) that does."""
    def runs(name: str) -> bool:
        limit = planners.capabilities(name).max_cpu_processes
        return limit is None or limit >= world

    if runs(planned):
        return planned
    return next(n for n in auto_cpu_backends(planners) if runs(n))
