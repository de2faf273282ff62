"""The launching side of `recipeforge train`: plan, take the run directory, prepare the data, write the
worker spec, start the workers, and turn their outcome into the command's result.

`launch` reads as the run does, one step per line; each step is a function below (or a backend's
hook). With one process and no launcher, the run trains in this process (`train_here`).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from recipeforge.backends import get_backend
from recipeforge.backends.base import Backend
from recipeforge.backends.cluster import ClusterSpec, detect_cluster
from recipeforge.backends.data_ready import build_before_launch
from recipeforge.backends.launch import LaunchSpec, launch_spec, run_launcher
from recipeforge.backends.ray_launch import check_ray_installed, ray_address, ray_launch_spec, wants_ray
from recipeforge.backends.worker_spec import OUTCOME_NAME, Outcome, OutcomeKind, read_outcome, write_outcome_file
from recipeforge.config.pipeline import LoadedRecipe
from recipeforge.errors import RecipeError
from recipeforge.log import log
from recipeforge.outputs import run_lock
from recipeforge.outputs.run_dir import RunDir, default_run_dir
from recipeforge.plan.types import Plan
from recipeforge.plan.world import plan_for_world, processes_per_node
from recipeforge.run.options import LaunchFailed, LaunchOptions
from recipeforge.run.run_directory import prepare_run
from recipeforge.run.session import evaluate_after_training, push_to_hub
from recipeforge.stages import preemption
from recipeforge.stages.base import DistInfo


def launch(loaded: LoadedRecipe, plan: Plan | None, opts: LaunchOptions, *, overwrite: bool,
           force: bool) -> Path | None:
    """The command a user runs: plan, then train here or start the launcher (on every node); returns
    the run directory (None for a dry run)."""
    cluster = detect_cluster(opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port)
    plan = plan or plan_for_world(loaded.recipe, nnodes=cluster.nnodes if cluster.source != "local" else None,
                                  nproc_per_node=opts.nproc_per_node)
    backend = accepted_backend(loaded, plan, cluster, opts)
    run = RunDir(default_run_dir(loaded.recipe, Path(loaded.path)).absolute())
    on_ray = wants_ray(loaded.recipe, opts)
    if on_ray and not opts.dry_run:
        check_ray_installed()
    if backend.launcher(plan) == "none" and not opts.dry_run and not on_ray:
        if loaded.recipe.distributed.max_restarts:
            # Restarts are the elastic agent's; one process trains here, with no agent to restart it.
            log(f"warning: distributed.max_restarts={loaded.recipe.distributed.max_restarts} has no effect: one "
                "process trains inside this command (no launcher); rerun the command to resume")
        return train_here(loaded, plan, run, opts, overwrite=overwrite, force=force)
    spec = worker_launch(loaded, plan, run, cluster, opts)
    if on_ray:  # the same launch, its workers started by Ray Train on a Ray cluster
        spec = ray_launch_spec(spec, plan, loaded.recipe, run_dir=run.root,
                               address=ray_address(loaded.recipe, opts.ray_address))
    if opts.dry_run:
        print_dry_run(plan, spec)
        return None
    if cluster.is_main_node:
        prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    # Tokenize here, before any worker exists: a worker waiting for another's tokenization inside a
    # collective would run into the process-group timeout. The workers then read the cache.
    build_before_launch(loaded, log=log)
    if cluster.is_main_node:
        backend.prepare_launch(loaded, plan, run, log=log)  # e.g. Megatron's checkpoint conversion
    start_workers(spec, run)
    if cluster.is_main_node:
        backend.finish_launch(loaded, plan, run, log=log)  # e.g. Megatron's export to final/
        evaluate_after_training(loaded, run.root)
        push_to_hub(loaded, run.root)
    return run.root


def accepted_backend(loaded: LoadedRecipe, plan: Plan, cluster: ClusterSpec, opts: LaunchOptions) -> Backend:
    """The plan's backend, once it, the plan's numbers, the recipe's lock and the node count accept
    the run (the launching command checks; its workers run what it accepted)."""
    from recipeforge.components.data_checks import check_plan_numbers

    backend = get_backend(plan.backend)
    backend.check(plan, loaded.recipe)
    check_plan_numbers(plan)
    if loaded.recipe.lock is not None:
        from recipeforge.config.lock import check_lock, plan_hardware

        check_lock(loaded, plan_hardware(plan), strict=opts.strict, warn=log)
    if plan.nodes != cluster.nnodes and not wants_ray(loaded.recipe, opts):  # Ray places workers on its nodes
        raise RecipeError(f"the plan spans {plan.nodes} nodes, and this command was started for {cluster.nnodes}",
                          key="hardware.nodes",
                          hint="start one `recipeforge train` per node with --nnodes/--node-rank/--master-addr, "
                               "or submit `recipeforge launch --slurm RECIPE`")
    return backend


def worker_launch(loaded: LoadedRecipe, plan: Plan, run: RunDir, cluster: ClusterSpec,
                  opts: LaunchOptions) -> LaunchSpec:
    """The launcher command, its files and the worker spec of this node. Files of the main node go into
    the run directory; other nodes keep theirs node-local, so they never touch what the main node
    prepares (or wipes with --overwrite)."""
    files_dir = None if cluster.is_main_node or opts.dry_run else Path(tempfile.mkdtemp(prefix="recipeforge-launch-"))
    from recipeforge.run.spec import launch_settings, recipe_env

    return launch_spec(plan, loaded.recipe, recipe_path=worker_recipe_path(loaded, run, opts),
                       overrides=opts.overrides, run_dir=run.root, cluster=cluster, files_dir=files_dir,
                       settings=launch_settings(opts), recipe_env=recipe_env())


def worker_recipe_path(loaded: LoadedRecipe, run: RunDir, opts: LaunchOptions) -> str:
    """The recipe file the workers load: the one on the command line, or (called as a library) the
    resolved recipe the run directory keeps (overrides, defaults and absolute data paths included),
    unless values in it had to be redacted."""
    if opts.recipe_path is not None:
        return opts.recipe_path
    from recipeforge.config.secrets import has_redactions

    if has_redactions(loaded):  # secrets from the environment, or credentials written in the recipe
        raise RecipeError("this recipe holds secrets that its written copy redacts; launch it with the command line",
                          hint="run `recipeforge train RECIPE ...` so every worker resolves the recipe itself")
    return str(run.resolved_recipe)


def print_dry_run(plan: Plan, spec: LaunchSpec) -> None:
    """Print the plan's line and the launch (the printed command never shows a password from an
    override; the launched one keeps it)."""
    from recipeforge.credentials import redact_credentials

    print(redact_credentials(f"# plan: {plan_line(plan)}\n" + spec.render()), end="")


def plan_line(plan: Plan) -> str:
    """One line: backend, processes and the batch arithmetic."""
    per = processes_per_node(plan)
    unit = ("GPU" if per == 1 else "GPUs") if plan.device == "cuda" else ("CPU process" if per == 1 else "CPU processes")
    return (f"{plan.backend}{f' ({plan.preset})' if plan.preset else ''}, {plan.nodes} node(s) x {per} {unit} = "
            f"{plan.world_size} processes; micro batch {plan.micro_batch_size} x accumulation "
            f"{plan.gradient_accumulation} x data parallel {plan.data_parallel} = global batch {plan.global_batch_size}")


def start_workers(spec: LaunchSpec, run: RunDir) -> None:
    """Start the launcher and wait for it; the workers' outcome decides the result: preempted (exit
    75), a user error only a worker could see (exit 2), another failure (`LaunchFailed`). A worker that
    ended badly after the run finished (every rank saved and left the process group) is a warning."""
    outcome_path = spec.outcome_path or run.root / OUTCOME_NAME
    outcome_path.unlink(missing_ok=True)  # an earlier launch's
    lock = run_lock.held(run.root)
    code = run_launcher(spec, log=log, pass_fds=(lock.fd,) if lock is not None else ())
    outcome = read_outcome(outcome_path)
    if outcome is not None and outcome.kind == OutcomeKind.PREEMPTED:
        raise preemption.Preempted.from_dict(outcome.preempted or {})
    if code != 0 and outcome is not None and outcome.kind == OutcomeKind.FINISHED:
        warn_unclean_exit(outcome_path, outcome, code)
        return
    if code != 0:
        if outcome is not None and outcome.kind in OutcomeKind.user_errors():
            raise RecipeError(outcome.message or "a worker reported a problem in the recipe")
        raise LaunchFailed(code)


def warn_unclean_exit(outcome_path: Path, outcome: Outcome, code: int) -> None:
    """A worker exited with an error after the run finished: final/ is complete (every rank saved
    and left the process group before rank 0 wrote `finished`), so the run stands, but the exit is
    said on the console and kept in the outcome rather than passed over."""
    message = (f"a worker exited with code {code} after the run finished (final/ was saved by then, so the run "
               f"is complete); its output is above")
    log(f"warning: {message}")
    write_outcome_file(outcome_path, replace(outcome, message=message))


def train_here(loaded: LoadedRecipe, plan: Plan, run: RunDir, opts: LaunchOptions, *, overwrite: bool,
               force: bool) -> Path:
    """One process: prepare the run directory, write the spec there and run the worker entry on it in
    this process (the recipe already loaded), then evaluate and push."""
    from recipeforge.backends.worker_spec import SPEC_NAME, WorkerSpec
    from recipeforge.run.spec import spec_for
    from recipeforge.run.worker import run_worker

    preemption.install()  # SIGTERM/SIGUSR1/Ctrl-C: save a checkpoint at the end of the step, then stop
    prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    spec_for(loaded, opts, plan_path=run.plan, run_dir=run.root, outcome=None).write(run.root / SPEC_NAME)
    run_worker(WorkerSpec.read_trusted(run.root / SPEC_NAME), loaded, DistInfo())
    evaluate_after_training(loaded, run.root)
    push_to_hub(loaded, run.root)
    return run.root
