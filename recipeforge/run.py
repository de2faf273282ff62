"""Entry points the CLI calls: `train`, `preprocess`, `merge`.

Importing this module is cheap; torch, transformers, TRL and datasets load inside the functions
that need them. `train` plans once for the processes asked for; one process trains in place, more are
started through the backend's launcher (`backends.launch`). Inside a launched process (RANK/WORLD_SIZE
set: our launcher, or ``accelerate launch -m recipeforge train ...`` / ``torchrun -m recipeforge ...``)
`train` runs as that worker and never relaunches; rank 0 alone writes the run directory's files.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.outputs.preflight import reports_write_errors


@dataclass(frozen=True)
class LaunchOptions:
    """How `recipeforge train` was started: what the launcher needs to start the same recipe again in
    each worker, and the process layout asked for on the command line."""

    recipe_path: str | None = None            # the recipe as given (workers load it again)
    overrides: tuple[str, ...] = ()
    nproc_per_node: int | None = None         # CPU processes per node (GPU runs: one per GPU)
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    dry_run: bool = False
    debug: bool = False
    strict: bool = False                      # a locked recipe: refuse (not warn) when the environment differs


class LaunchFailed(Exception):
    """The launcher (and so a worker) exited with an error; the workers printed why."""

    def __init__(self, code: int):
        super().__init__(f"the launcher exited with code {code} (the workers' messages are above)")
        self.code = code


def train(loaded, *, overwrite: bool = False, force: bool = False, plan=None,
          launch: LaunchOptions | None = None) -> Path | None:
    """Train `loaded` (a `config.LoadedRecipe`); returns the run directory (None for a dry run).

    Plans once (or takes `plan`) for the processes the command line asks for. One process trains
    here; more are started through the backend's launcher, each worker reading the plan written
    before launch. Inside a launched worker (RANK/WORLD_SIZE set) this runs that worker.
    """
    from recipeforge.backends.worker_spec import launched_worker
    from recipeforge.stages.base import DistInfo

    from recipeforge.outputs import run_lock
    from recipeforge.stages import preemption

    _network_guards()
    dist = DistInfo.from_env()
    from recipeforge.outputs import library_warnings

    library_warnings.route_library_warnings(dist.rank)  # library warnings: RUN/logs/warnings.log, not the console
    try:
        if dist.world_size > 1 or launched_worker():
            preemption.install()  # as early as possible: a stop request during setup is kept
            return _train_worker(loaded, dist, overwrite=overwrite, force=force)
        return _train_launching(loaded, plan, launch or LaunchOptions(), overwrite, force)
    finally:
        from recipeforge.stages.base import _log

        library_warnings.stop_routing(log=_log if dist.is_main else None)
        preemption.uninstall()
        run_lock.release_all()


def _train_launching(loaded, plan, opts: LaunchOptions, overwrite: bool, force: bool) -> Path | None:
    """The command a user runs: plan, then train here or start the launcher (on every node)."""
    import tempfile

    from recipeforge.backends import get_backend
    from recipeforge.backends.cluster import detect_cluster
    from recipeforge.backends.launch import launch_spec, run_launcher
    from recipeforge.outputs.run_dir import RunDir, default_run_dir
    from recipeforge.plan.world import plan_for_world
    from recipeforge.stages.base import _log

    recipe = loaded.recipe
    cluster = detect_cluster(opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port)
    if plan is None:
        nnodes = cluster.nnodes if cluster.source != "local" else None
        plan = plan_for_world(recipe, nnodes=nnodes, nproc_per_node=opts.nproc_per_node)
    backend = get_backend(plan.backend)
    backend.check(plan, recipe)
    from recipeforge.components.data_checks import check_plan_numbers

    check_plan_numbers(plan)
    if recipe.lock is not None:  # the launching command checks; its workers run what it accepted
        from recipeforge.config.lock import check_lock, plan_hardware

        check_lock(loaded, plan_hardware(plan), strict=opts.strict, warn=_log)
    if plan.nodes != cluster.nnodes:
        raise RecipeError(f"the plan spans {plan.nodes} nodes, and this command was started for {cluster.nnodes}",
                          key="hardware.nodes",
                          hint="start one `recipeforge train` per node with --nnodes/--node-rank/--master-addr, "
                               "or submit `recipeforge launch --slurm RECIPE`")
    run = RunDir(default_run_dir(recipe, Path(loaded.path)).absolute())
    if backend.launcher(plan) == "none" and not opts.dry_run:
        return _train_here(loaded, plan, run, backend, overwrite, force)
    # Files of the main node go into the run directory; other nodes keep theirs node-local, so they
    # never touch what the main node prepares (or wipes with --overwrite).
    files_dir = None if cluster.is_main_node or opts.dry_run else Path(tempfile.mkdtemp(prefix="recipeforge-launch-"))
    recipe_path = opts.recipe_path
    if recipe_path is None:
        # Called as a library: the workers load the resolved recipe the run directory keeps (overrides,
        # defaults and absolute data paths included), unless values in it had to be redacted.
        from recipeforge.config.secrets import has_redactions

        if has_redactions(loaded):  # secrets from the environment, or credentials written in the recipe
            raise RecipeError("this recipe holds secrets that its written copy redacts; launch it with the "
                              "command line",
                              hint="run `recipeforge train RECIPE ...` so every worker resolves the recipe itself")
        recipe_path = str(run.resolved_recipe)
    spec = launch_spec(plan, recipe, recipe_path=recipe_path, overrides=opts.overrides,
                       run_dir=run.root, cluster=cluster, files_dir=files_dir, debug=opts.debug)
    if opts.dry_run:
        from recipeforge.credentials import redact_credentials

        # The printed command never shows a password from an override (the launched one keeps it).
        print(redact_credentials(f"# plan: {_plan_line(plan)}\n" + spec.render()), end="")
        return None
    if cluster.is_main_node:
        _prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    from recipeforge.backends.data_ready import build_before_launch

    # Tokenize here, before any worker exists: a worker waiting for another's tokenization inside a
    # collective would run into the process-group timeout. The workers then read the cache.
    build_before_launch(loaded, log=_log)
    if cluster.is_main_node:
        backend.prepare_launch(loaded, plan, run, log=_log)  # e.g. Megatron's checkpoint conversion
    from recipeforge.backends.worker_spec import OutcomeKind, read_outcome
    from recipeforge.outputs import run_lock
    from recipeforge.stages.preemption import Preempted

    spec.outcome_path.unlink(missing_ok=True)  # an earlier launch's
    lock = run_lock.held(run.root)
    code = run_launcher(spec, log=_log, pass_fds=(lock.fd,) if lock is not None else ())
    outcome = read_outcome(spec.outcome_path)
    if outcome is not None and outcome.kind == OutcomeKind.PREEMPTED:
        raise Preempted.from_dict(outcome.preempted or {})
    if code != 0:
        if outcome is not None and outcome.kind == OutcomeKind.USER_ERROR:
            # A mistake in the recipe or data that only a worker could see: still a user error (exit 2).
            raise RecipeError(outcome.message or "a worker reported a problem in the recipe")
        raise LaunchFailed(code)
    if cluster.is_main_node:
        backend.finish_launch(loaded, plan, run, log=_log)  # e.g. Megatron's export to final/
    if cluster.is_main_node:
        _push_to_hub(loaded, run.root)
    return run.root


def _plan_line(plan) -> str:
    from recipeforge.plan.world import processes_per_node

    per = processes_per_node(plan)
    unit = ("GPU" if per == 1 else "GPUs") if plan.device == "cuda" else ("CPU process" if per == 1 else "CPU processes")
    return (f"{plan.backend}{f' ({plan.preset})' if plan.preset else ''}, {plan.nodes} node(s) x {per} {unit} = "
            f"{plan.world_size} processes; micro batch {plan.micro_batch_size} x accumulation "
            f"{plan.gradient_accumulation} x data parallel {plan.data_parallel} = global batch {plan.global_batch_size}")


def _train_here(loaded, plan, run, backend, overwrite: bool, force: bool) -> Path:
    """One process: prepare the run directory and train in this process."""
    from recipeforge.stages import preemption
    from recipeforge.stages.base import DistInfo, _log

    preemption.install()  # SIGTERM/SIGUSR1/Ctrl-C: save a checkpoint at the end of the step, then stop
    resume_from = _prepare_run(loaded, plan, run, overwrite=overwrite, force=force)
    _run(loaded, plan, run, backend, DistInfo(), resume_from)
    _log(f"done: {run.root}")
    _push_to_hub(loaded, run.root)
    return run.root


def _train_worker(loaded, dist, *, overwrite: bool, force: bool) -> Path:
    """One rank of a launched job (see `_run_worker`). When `recipeforge train` launched it, how the
    job ended goes back as a typed `Outcome` next to the worker spec: a preemption (first local
    rank), or a user error (rank 0; out of memory from any rank), which the launching command then
    reports as for any recipe mistake."""
    from recipeforge.backends.worker_spec import Outcome, OutcomeKind, current_spec, write_outcome
    from recipeforge.stages.preemption import Preempted

    spec = current_spec()
    try:
        return _run_worker(loaded, dist, spec, overwrite=overwrite, force=force)
    except Preempted as stop:
        # Every rank stopped at the same step: leave the process group together, then report.
        from recipeforge.backends import worker as w

        w.finish()
        if spec is not None and dist.local_rank == 0:
            write_outcome(spec, Outcome(OutcomeKind.PREEMPTED.value, stop.describe(), stop.to_dict(), dist.rank))
        raise
    except RecipeError as exc:
        from recipeforge.plan.oom import OutOfMemory

        # Rank 0 reports recipe mistakes; running out of memory can happen on any rank.
        if spec is not None and (dist.is_main or isinstance(exc, OutOfMemory)):
            from recipeforge.errors import locate_problems

            located = locate_problems(exc, loaded.tree.locate) if getattr(loaded, "tree", None) else exc
            write_outcome(spec, Outcome(OutcomeKind.USER_ERROR.value, located.render(), rank=dist.rank))
        raise


def _run_worker(loaded, dist, spec, *, overwrite: bool, force: bool) -> Path:
    """One rank of a launched job. Started by `recipeforge train`, it runs the plan its `spec` names
    (the run directory is ready). Started directly by a launcher (no spec), rank 0 plans for the
    launcher's world and prepares the run directory while the others wait."""
    import signal

    from recipeforge.backends import get_backend
    from recipeforge.backends import worker as w
    from recipeforge.backends.parent_death import end_with_parent
    from recipeforge.outputs import checkpoint
    from recipeforge.outputs.run_dir import RunDir, default_run_dir
    from recipeforge.plan.world import check_world, plan_for_world
    from recipeforge.stages.base import _log

    end_with_parent(signal.SIGTERM)  # the launcher gone: save at the next step boundary and end
    recipe = loaded.recipe
    if spec is not None:
        plan = w.read_plan(Path(spec.plan))
        run = RunDir(Path(spec.run_dir).absolute())
        w.init_process_group(plan.device, recipe.distributed.timeout_minutes)
        plan = w.agreed_plan(plan)
    else:
        run = RunDir(default_run_dir(recipe, Path(loaded.path)).absolute())
        w.init_process_group(w.worker_device(recipe), recipe.distributed.timeout_minutes)
        plan = w.on_main(lambda: plan_for_world(recipe, nnodes=w.launched_world()[0],
                                                nproc_per_node=w.launched_world()[1]), dist)
        plan = w.agreed_plan(plan)
        check_world(plan, dist.world_size)
        w.on_main(lambda: _prepare_run(loaded, plan, run, overwrite=overwrite, force=force), dist)
    check_world(plan, dist.world_size)
    backend = get_backend(plan.backend)
    backend.check(plan, recipe)
    resume_from = checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints)
    _run(loaded, plan, run, backend, dist, resume_from)
    w.finish()
    if dist.is_main:
        _log(f"done: {run.root}")
        if spec is None:  # launched directly (torchrun -m recipeforge): no launching command pushes
            _push_to_hub(loaded, run.root)
    return run.root


def _push_to_hub(loaded, run_root: Path) -> None:
    """`output.push_to_hub`: upload the saved model once the run is complete (`outputs.hub`). A failed
    upload raises `outputs.hub.PushFailed`; the run directory is already complete then."""
    hub = loaded.recipe.output.push_to_hub
    if hub is None:
        return
    from recipeforge.outputs.hub import push
    from recipeforge.stages.base import _log

    _log(f"pushing the model to the Hub: {hub.repo_id}")
    _log(f"pushed: {push(run_root, hub.repo_id, private=hub.private, log=_log)}")


@reports_write_errors
def _prepare_run(loaded, plan, run, *, overwrite: bool, force: bool = False) -> Path | None:
    """Create (or check, or with `overwrite` wipe) the run directory and write the recipe, plan and
    environment; returns the checkpoint to resume from. Main process of the main node only."""
    from recipeforge.outputs import checkpoint
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.outputs.run_dir import prepare
    from recipeforge.stages.base import _log

    from recipeforge.outputs.run_guard import check_existing_run

    recipe = loaded.recipe
    # Everything that can refuse the run does so before the run directory is touched: the services the
    # recipe names (trackers, the Hub, a generation server), then whether its location can and may be
    # written (data paths resolved, so a folder inside a dataset is refused).
    from recipeforge.outputs.services import check_services

    check_services(recipe, loaded.tree.locate)
    _check_output_location(loaded, plan, run, overwrite=overwrite)
    from recipeforge.outputs import run_lock

    run_lock.acquire(run.root, log=_log)  # one run per directory, held until this process ends
    resolved = _resolved_for_run(loaded, run)
    if not overwrite:
        check_existing_run(run, resolved, force=force)
    named = None
    if recipe.output.resume not in ("auto", "never"):  # verified (a damaged one is exit 2, naming the file)
        named = checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints, verify=True)
    prepare(run, overwrite=overwrite, resume=recipe.output.resume)
    from recipeforge.outputs.library_warnings import warnings_to_run_dir

    warnings_to_run_dir(run.root)
    run_lock.reassert(run.root, log=_log)  # --overwrite removed the lock file with the rest
    checkpoint.remove_incomplete(run.checkpoints)
    resume_from = named or checkpoint.resume_checkpoint(recipe.output.resume, run.checkpoints, verify=True,
                                                        log=_log)
    run.write_recipe(resolved, Path(loaded.path))
    run.write_plan(plan)
    run.write_environment()
    from recipeforge.config.lock import build_lock, plan_hardware

    run.write_lock({**resolved, "lock": build_lock(loaded, plan_hardware(plan))}, Path(loaded.path))
    writer = MetricsWriter(run.metrics)
    if resume_from is not None:
        writer.truncate_after(checkpoint.step_of(resume_from) or 0)
        _log(f"resuming from {resume_from}")
    elif run.metrics.exists():
        run.metrics.unlink()
    return resume_from


@reports_write_errors
def _run(loaded, plan, run, backend, dist, resume_from) -> None:
    """Run the stage on `backend` in this process (one rank, or the only process)."""
    from recipeforge.stages.base import StageContext

    ctx = StageContext(loaded=loaded, plan=plan, run=run, resume_from=resume_from, dist=dist,
                       save_final=backend.save_final)
    from recipeforge.outputs.library_warnings import warnings_to_run_dir

    if plan.device != "cuda":
        from recipeforge.backends.launch import cpu_engine_env

        os.environ.update(cpu_engine_env())

    warnings_to_run_dir(run.root)
    if dist.world_size > 1:
        from recipeforge.backends import worker as w

        ctx.barrier = w.barrier
    backend.setup_worker(ctx)
    ctx.backend_kwargs = backend.trainer_kwargs(ctx)
    runner = _run_stage(ctx, backend)
    if dist.is_main:
        # A backend exporting final/ after the job (Megatron) merges there (`finish_launch`).
        if ctx.recipe.output.merge_adapter and ctx.recipe.adapter.type != "none" \
                and not backend.exports_after_job:
            from recipeforge.outputs.export import merge_adapter

            merge_adapter(run.root)
        from recipeforge.outputs.report import write_loss_plot

        write_loss_plot(run.root, log=ctx.log)  # loss.png, which the model card shows
        _write_card(ctx, runner)


def _run_stage(ctx, backend):
    from recipeforge.outputs.metrics import MetricsWriter
    from recipeforge.stages import runner_class

    own_runner = backend.runner(ctx.recipe.stage)
    runner = runner_class(ctx.recipe.stage, own_runner)(ctx)
    if ctx.dist.world_size > 1:
        # One process per machine tokenizes and caches the data first (a cache hit when `recipeforge
        # train` built it before launching); the others poll for it outside any collective, then read it.
        from recipeforge.backends import worker as w
        from recipeforge.backends.data_ready import prepare_on_first_rank

        prepare_on_first_rank(lambda: runner_class(ctx.recipe.stage, own_runner)(ctx), ctx.dist, broadcast=w.broadcast,
                              barrier=w.barrier, log=ctx.log)
    try:
        runner.setup()
        if ctx.dist.is_main and runner.data_stats:
            MetricsWriter(ctx.run.metrics).write({"split": "data", "step": 0, **runner.data_stats})
        runner.train()
        if ctx.dist.is_main and backend.reports_runtime:
            _write_backend_report(ctx, runner, backend)
        runner.save()
    except Exception as exc:
        from recipeforge.stages.oom import is_out_of_memory, out_of_memory_error

        if not is_out_of_memory(exc):
            raise
        # Answered with the plan's numbers and what would fit, as any recipe that does not fit is.
        raise out_of_memory_error(ctx, runner, exc) from None
    return runner


def _write_backend_report(ctx, runner, backend) -> None:
    """backend.json: what ran, observed from inside the (main) worker, next to what was planned."""
    from recipeforge.outputs.run_dir import _atomic_write

    report = {"planned": {"backend": ctx.plan.backend, "preset": ctx.plan.preset, "world_size": ctx.plan.world_size,
                          "backend_part": asdict(ctx.plan.backend_part)},
              "observed": backend.runtime_report(runner.trainer) if runner.trainer is not None else {}}
    _atomic_write(ctx.run.root / "backend.json", json.dumps(report, indent=2, default=str) + "\n")


def preprocess(loaded) -> dict:
    """Build the tokenized-data cache of a pretrain/SFT recipe ahead of training; returns statistics.

    DPO and GRPO data are tokenized by their trainers; for them the rows are read, remapped and
    checked, and their counts returned.
    """
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import StageContext

    recipe = loaded.recipe
    _network_guards()
    from recipeforge.outputs.services import check_services

    check_services(recipe, loaded.tree.locate, downloads_only=True)
    runner = runner_class(recipe.stage)(StageContext(loaded=loaded, plan=None, run=None))
    runner.tokenizer = runner.load_tokenizer()
    runner.prepare_data()
    from recipeforge.components.data_checks import check_runner_numbers

    check_runner_numbers(runner)
    stats = dict(runner.data_stats)
    data = getattr(runner, "data", None)
    if data is not None and getattr(data, "cache_path", None) is not None:
        stats["cache_path"] = str(data.cache_path)
        stats["fingerprint"] = data.fingerprint
    return stats


def merge(run_dir: Path, out_dir: Path | None = None) -> Path:
    """Merge the LoRA adapter of a finished run into its base model (safetensors); returns the folder
    (default ``RUN_DIR/merged``)."""
    from recipeforge.outputs.export import merge_adapter

    return merge_adapter(Path(run_dir), Path(out_dir) if out_dir is not None else None)


def _network_guards() -> None:
    """No telemetry of any kind, from any library, set before they are imported (they read it once).

    Hub access itself is left alone: a tiny model with local data never asks the hub for anything,
    and forcing offline mode would break hub ids for anything later in the same process.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def _check_output_location(loaded, plan, run, *, overwrite: bool) -> None:
    """Refuse an output location the run cannot or must not write, before anything is written there."""
    from recipeforge.components.data import DatasetRef, resolve_local
    from recipeforge.outputs.preflight import check_output_location, planned_output
    from recipeforge.stages.base import _log

    base = Path(loaded.path).resolve().parent
    data = []
    for section in ("datasets", "eval_datasets"):
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            ref = DatasetRef(spec, section, i)
            found = resolve_local(ref, base_dir=base, locate=loaded.tree.locate)
            if found is not None:
                data.append((ref.key, found))
    check_output_location(run.root, recipe_path=Path(loaded.path), datasets=data, overwrite=overwrite,
                          planned=planned_output(plan, loaded.recipe), log=_log)


def _resolved_for_run(loaded, run) -> dict:
    """The recipe as the run used it: every default filled in, secrets redacted, local data paths made
    absolute and `output.dir` pinned, so ``recipeforge train RUN/resolved_recipe.yaml`` works from
    anywhere and continues this run."""
    from recipeforge.components.data import DatasetRef, local_path, spec_base_dir
    from recipeforge.config.dump import resolved_data

    data = resolved_data(loaded)
    base = Path(loaded.path).resolve().parent
    for section in ("datasets", "eval_datasets"):
        for i, spec in enumerate(getattr(loaded.recipe.data, section)):
            found = local_path(spec.path, spec_base_dir(DatasetRef(spec, section, i), base, loaded.tree.locate))
            if found is not None:
                data["data"][section][i]["path"] = str(found)
    from recipeforge.components.chat_templates import is_template_path, template_file

    template = loaded.recipe.data.chat_template
    if is_template_path(template):  # a .jinja file next to the recipe: absolute, like the data paths
        found = template_file(template, base_dir=base, location=loaded.tree.locate(("data", "chat_template")))
        if found is not None:
            data["data"]["chat_template"] = str(found)
    data["output"]["dir"] = str(run.root)
    return data


def _write_card(ctx, runner) -> None:
    from recipeforge.outputs.model_card import write_model_card

    recipe_data = _resolved_for_run(ctx.loaded, ctx.run)
    write_model_card(ctx.run.readme, recipe=ctx.recipe, recipe_data=recipe_data, plan=ctx.plan,
                     data_stats=runner.data_stats, run_dir=ctx.run.root,
                     adapter=ctx.recipe.adapter.type != "none")


def summary(run_dir: Path) -> dict[str, Any]:
    """First and last value of the main metrics of a finished run (for the CLI to print)."""
    from recipeforge.outputs.metrics import read_metrics, series
    from recipeforge.stage_specs import REPORTED_METRICS

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    out = {}
    for key in REPORTED_METRICS:
        values = series(records, key)
        if values:
            out[key] = {"first": values[0], "last": values[-1]}
    return out
