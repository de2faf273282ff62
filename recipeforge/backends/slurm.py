"""`recipeforge launch --slurm`: an sbatch script that runs one recipeforge launcher per node.

Each node's `recipeforge train` reads its rank from Slurm's environment (see `cluster.detect_cluster`)
and starts the real launcher for its local GPUs; the main node's address comes from the allocation.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from recipeforge.backends.cluster import DEFAULT_PORT
from recipeforge.config.secrets import public


@dataclass(frozen=True)
class SlurmOptions:
    """Scheduler settings that are not part of the recipe (they describe the allocation)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None          # e.g. "48:00:00"
    cpus_per_task: int | None = None
    qos: str | None = None
    extra: tuple[str, ...] = ()      # further "#SBATCH" options, e.g. "--constraint=h100"


def sbatch_script(*, job_name: str, nodes: int, gpus_per_node: int, recipe: str, overrides: Sequence[str],
                  run_dir: Path, options: SlurmOptions = SlurmOptions(), port: int = DEFAULT_PORT,
                  executable: str = "recipeforge", train_flags: Sequence[str] = ()) -> str:
    """The text of an sbatch script for the planned allocation."""
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
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
              "#SBATCH --exclusive",
              "",
              "set -euo pipefail",
              "# The first node of the allocation hosts the rendezvous; every node starts one launcher.",
              'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
              f"export MASTER_PORT={port}",
              "",
              "srun --kill-on-bad-exit=1 " + shlex.join([executable, "train", recipe, *overrides, *train_flags]),
              ""]
    return "\n".join(lines)


def write_sbatch(loaded, *, recipe: str, overrides: Sequence[str], options: SlurmOptions = SlurmOptions(),
                 nproc_per_node: int | None = None, port: int | None = None, output: str | None = None) -> Path:
    """Plan `loaded` and write its sbatch script (default: RUN_DIR/slurm.sbatch); returns the path.

    The run directory is created now: sbatch opens the job's log there (``--output``) before any node
    starts. Every node runs the same `recipeforge train` with an absolute recipe path and run directory,
    so the job does not depend on the directory it is submitted from.
    """
    from recipeforge.backends.world import plan_for_world, processes_per_node
    from recipeforge.outputs.run_dir import default_run_dir

    r = loaded.recipe
    plan = plan_for_world(r, nproc_per_node=nproc_per_node)
    run_dir = default_run_dir(r, Path(loaded.path)).absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    flags = ["--nproc-per-node", str(processes_per_node(plan))] if plan.device != "cuda" else []
    text = sbatch_script(job_name=public(loaded, ("name",), r.name) or Path(recipe).stem, nodes=plan.nodes,
                         gpus_per_node=plan.gpus_per_node if plan.device == "cuda" else 0,
                         recipe=str(Path(recipe).absolute()), overrides=[*overrides, f"output.dir={run_dir}"],
                         run_dir=run_dir, options=options, port=port or DEFAULT_PORT, train_flags=flags)
    path = Path(output) if output else run_dir / "slurm.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
