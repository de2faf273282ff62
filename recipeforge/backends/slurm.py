"""`recipeforge launch --slurm`: an sbatch script that runs one recipeforge launcher per node.

Each node's `recipeforge train` reads its rank from Slurm's environment (see `cluster.detect_cluster`)
and starts the real launcher for its local GPUs; the main node's address comes from the allocation.

Preemption and time limits: the script asks Slurm for USR1 `signal_lead` seconds before the time limit
(``--signal=B:USR1@<s>``, to the batch shell) and makes the job requeueable (``--requeue``). srun runs in
the background so the shell's traps fire at once; they pass USR1 or TERM on to srun, which forwards
them to every node's `recipeforge train`, whose processes finish their step, save a checkpoint and exit
with 75. After a USR1 the script requeues the job (``scontrol requeue``); a preempted job is requeued by
Slurm itself. The requeued job runs the same command, which resumes from the newest checkpoint.

Elastic restarts (`distributed.max_restarts`) and the rendezvous (`distributed.rdzv_*`) travel in the
recipe every node reads; the script's header says what they are (`elastic_lines`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from recipeforge.backends import job_values
from recipeforge.backends.cluster import DEFAULT_PORT
from recipeforge.config.secrets import public
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.config.pipeline import LoadedRecipe
    from recipeforge.config.schema import DistributedConfig
    from recipeforge.plan.types import Plan

SIGNAL_LEAD_S = 120   # seconds of warning before the time limit: the step, a checkpoint save, the exit
EXIT_PREEMPTED = 75   # `recipeforge train` stopped on a signal after saving (stages.preemption)


@dataclass(frozen=True)
class SlurmOptions:
    """Scheduler settings that are not part of the recipe (they describe the allocation)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None          # e.g. "48:00:00"
    cpus_per_task: int | None = None
    qos: str | None = None
    extra: tuple[str, ...] = ()      # further "#SBATCH" options, e.g. "--constraint=h100"
    signal_lead: int = SIGNAL_LEAD_S  # USR1 this many seconds before the time limit


def check_options(options: SlurmOptions) -> SlurmOptions:
    """`options` as they may go into ``#SBATCH`` lines (`job_values`); a `RecipeError` naming the flag
    otherwise."""
    for flag, value in (("--partition", options.partition), ("--account", options.account), ("--qos", options.qos)):
        if value is not None:
            job_values.slurm_name(value, flag)
    if options.time is not None:
        job_values.slurm_time(options.time)
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise RecipeError(f"must be 1 or more (got {options.cpus_per_task})", key="--cpus-per-task")
    return replace(options, extra=tuple(job_values.sbatch_option(opt) for opt in options.extra))


def sbatch_script(*, job_name: str, nodes: int, gpus_per_node: int, recipe: str, overrides: Sequence[str],
                  run_dir: Path, options: SlurmOptions = SlurmOptions(), port: int = DEFAULT_PORT,
                  executable: str = "recipeforge", train_flags: Sequence[str] = (),
                  layout: Sequence[str] = ()) -> str:
    """The text of an sbatch script for the planned allocation. `layout`: comment lines describing the
    plan's process layout (`layout_lines`).

    Every value is checked for where it lands (`check_options`, `job_values`): ``#SBATCH`` values by
    Slurm's syntax, the job name reduced to safe characters, the `srun` command line shell-quoted and
    free of control characters and credentials, the comments free of line breaks."""
    options = check_options(options)
    job_values.sbatch_path(str(run_dir), "output.dir")
    job_values.check_command_values([("recipe", recipe), *((_override_key(o), o) for o in overrides),
                                     *(("--nproc-per-node", f) for f in train_flags)], where="the sbatch script")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_values.job_name(job_name)}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if options.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("time", options.time), ("qos", options.qos)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {opt}" for opt in options.extra]
    lines += [f"#SBATCH --output={run_dir}/slurm-%j.out",
              "#SBATCH --open-mode=append",
              "#SBATCH --exclusive",
              f"#SBATCH --signal=B:USR1@{options.signal_lead}",
              "#SBATCH --requeue",
              "",
              *[f"# {_comment(line)}" for line in layout],
              "set -euo pipefail",
              "# The first node of the allocation hosts the rendezvous; every node starts one launcher.",
              'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
              f"export MASTER_PORT={int(port)}",
              "",
              f"# USR1 ({options.signal_lead} s before the time limit) and TERM (preemption, scancel) go on to every "
              "node's",
              f"# recipeforge train: it saves a checkpoint and exits with {EXIT_PREEMPTED}; rerunning the job "
              "resumes from it.",
              "srun --kill-on-bad-exit=1 " + shlex.join([executable, "train", recipe, *overrides, *train_flags]) + " &",
              "srun_pid=$!",
              "requeue=0",
              'forward() { echo "recipeforge job: $1 received, the trainers save a checkpoint and stop" >&2; '
              'kill -s "$1" "$srun_pid" 2>/dev/null || true; }',
              "trap 'requeue=1; forward USR1' USR1",
              "trap 'forward TERM' TERM",
              "code=0",
              "while :; do",
              '  wait "$srun_pid" && code=0 || code=$?',
              '  kill -0 "$srun_pid" 2>/dev/null || break  # still running: a signal interrupted the wait',
              "done",
              f'if [ "$code" -eq {EXIT_PREEMPTED} ] && [ "$requeue" -eq 1 ]; then',
              '  echo "recipeforge job: checkpoint saved before the time limit; requeueing job $SLURM_JOB_ID" >&2',
              '  scontrol requeue "$SLURM_JOB_ID"',
              "fi",
              'exit "$code"',
              ""]
    return "\n".join(lines)


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("~") or "override"


def _comment(text: str) -> str:
    """`text` for one comment line: control characters (a line break would end the comment and run the
    rest) written as escapes."""
    return "".join(repr(ch)[1:-1] if job_values.control_characters(ch) else ch for ch in text)


def write_sbatch(loaded: LoadedRecipe, *, recipe: str, overrides: Sequence[str], options: SlurmOptions = SlurmOptions(),
                 nproc_per_node: int | None = None, port: int | None = None, output: str | None = None) -> Path:
    """Plan `loaded` and write its sbatch script (default: RUN_DIR/slurm.sbatch); returns the path.

    The run directory is created now: sbatch opens the job's log there (``--output``) before any node
    starts. Every node runs the same `recipeforge train` with an absolute recipe path and run directory,
    so the job does not depend on the directory it is submitted from.
    """
    from recipeforge.outputs.run_dir import default_run_dir
    from recipeforge.plan.world import plan_for_world, processes_per_node

    r = loaded.recipe
    plan = plan_for_world(r, nproc_per_node=nproc_per_node)
    run_dir = default_run_dir(r, Path(loaded.path)).absolute()
    flags = ["--nproc-per-node", str(processes_per_node(plan))] if plan.device != "cuda" else []
    text = sbatch_script(job_name=public(loaded, ("name",), r.name) or Path(recipe).stem, nodes=plan.nodes,
                         gpus_per_node=plan.gpus_per_node if plan.device == "cuda" else 0,
                         recipe=str(Path(recipe).absolute()), overrides=[*overrides, f"output.dir={run_dir}"],
                         run_dir=run_dir, options=options, port=port or DEFAULT_PORT, train_flags=flags,
                         layout=layout_lines(plan) + elastic_lines(r.distributed, run_dir))
    # Created once the script is known to be writable: a refused value leaves nothing behind.
    from recipeforge.outputs.ownership import OWNER_FILE, is_owned, mark_owned

    new = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    if new or (is_owned(run_dir) and not (run_dir / OWNER_FILE).exists()):
        mark_owned(run_dir, "run")
    path = Path(output) if output else run_dir / "slurm.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def elastic_lines(distributed: DistributedConfig, run_dir: Path) -> list[str]:
    """The header's account of the recipe's restarts and rendezvous (`distributed.max_restarts`,
    `rdzv_*`). The script passes nothing for them: every node's `recipeforge train` reads them from the
    recipe, and an endpoint written as ``${env:MASTER_ADDR,...}:PORT`` resolves on each node to the
    first node of the allocation, which the script exports as MASTER_ADDR."""
    from recipeforge.backends import elastic

    lines = []
    if distributed.max_restarts:
        lines.append(f"Elastic restarts: after a worker fails, torch's elastic agent restarts the worker group on "
                     f"every node up to {distributed.max_restarts} time(s), resuming from the newest complete "
                     "checkpoint; only then does the job fail")
    if elastic.is_elastic_rendezvous(distributed):
        lines.append(f"Rendezvous: {distributed.rdzv_backend} at {elastic.endpoint(distributed)} (as resolved when "
                     f"this script was written), id {elastic.rdzv_id(distributed, run_dir)}")
    return lines


def layout_lines(plan: Plan) -> list[str]:
    """What each node's `recipeforge train` launches, for the script's header: the backend and, with
    a parallelism mesh, its sizes and the accelerate settings the launch file carries."""
    from recipeforge.backends import parallelism

    lines = [f"Plan: {plan.backend}" + (f" ({plan.preset})" if plan.preset else "")
             + f", {plan.nodes} node(s) x {plan.gpus_per_node or 'CPU'} = {plan.world_size} processes; "
               "each node's recipeforge train writes the launch files and starts the launcher"]
    section = parallelism.accelerate_parallelism_section(plan).get("parallelism_config")
    if section:
        lines.append(f"Mesh: {parallelism.describe(plan)}")
        lines.append("accelerate parallelism_config: " + ", ".join(f"{k}={v}" for k, v in section.items()))
    dc = parallelism.distributed_config_kwargs(plan)
    if dc:
        lines.append("transformers DistributedConfig: " + ", ".join(f"{k}={v}" for k, v in dc.items()))
    return lines
