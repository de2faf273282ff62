"""`distributed.launcher: ray` / `recipeforge launch --ray`: the workers of a launch started by Ray Train.

The launch is the one `recipeforge train` makes for torchrun or accelerate (plan, run directory, data
prepared, worker spec, launch files); only the way the workers start differs. Instead of the backend's
launcher, `run_launcher` starts a Ray driver (``python -m recipeforge.ray_entry RUN/ray_job.json``, `ray_driver`)
that connects to an existing Ray cluster and runs Ray Train's `TorchTrainer`: one Ray worker per planned
process (one GPU each on a CUDA plan, one CPU otherwise), its process group set up by Ray (NCCL or gloo).
Each Ray worker sets what the backend's launcher would have set (accelerate's environment from the same
config file), changes to the launching command's working directory, and runs the same worker entry point
a torchrun worker runs (``python -m recipeforge.run.worker RUN/worker.json``: `run.worker.main`), so the
outcome file, the exit codes and preemption are a torchrun launch's.

`distributed.max_restarts` becomes Ray's `FailureConfig(max_failures=...)`: after a worker fails Ray
starts the whole worker group again, and the restarted workers resume from the newest complete checkpoint
(`run.restarts`, the attempt number counted in the run directory). A stop (SIGTERM, SIGUSR1, Ctrl-C) of
the launching command reaches the driver, which leaves a stop request next to the worker spec; every
worker's watcher turns it into the stop a signal asks for (save at the step's end, exit 75).

This module builds the job description only and imports no Ray (`--dry-run` prints it).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.backends.launch import LaunchSpec
    from recipeforge.config.schema import Recipe
    from recipeforge.plan.types import Plan

JOB_NAME = "ray_job.json"
STOP_NAME = "ray_stop"                 # the driver's stop request, next to the worker spec
ATTEMPTS_DIR = "ray_attempts"          # one marker per start of the worker group (rank 0 writes it)
STORAGE_DIR = "ray"                    # Ray Train's storage_path (its run state; no checkpoints of ours)
ADDRESS_ENV = "RAY_ADDRESS"
INSTALL_HINT = "pip install 'recipeforge[ray]'"
# Variables of the launching command's environment that the Ray workers get too (torchrun's workers
# inherit the whole environment; a Ray worker has its node's). Values are read by the driver when it
# starts, never written into the job file.
FORWARD_PREFIXES = ("RECIPEFORGE_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_", "MLFLOW_", "NCCL_",
                    "PYTORCH_", "DS_")
# Set by the launcher for one machine; Ray sets its own (threads per worker from its CPUs).
NOT_FORWARDED = ("OMP_NUM_THREADS",)


@dataclass(frozen=True)
class RayJob:
    """What the driver submits: the cluster, the workers and their resources, and the worker command."""

    address: str
    name: str
    num_workers: int
    use_gpu: bool
    resources_per_worker: dict[str, float]
    torch_backend: str                      # nccl | gloo (Ray Train's TorchConfig)
    timeout_s: int                          # process-group timeout (distributed.timeout_minutes)
    max_failures: int                       # distributed.max_restarts
    storage_path: str
    worker_argv: list[str]                  # the worker entry's arguments (`run.worker.main`), as a torchrun worker's
    worker_env: dict[str, str]              # the launch's environment for the workers
    spec_path: str                          # the worker spec (stop request and attempts sit next to it)
    cwd: str                                # the launching command's working directory
    accelerate_argv: list[str] = field(default_factory=list)   # `accelerate launch` arguments: the driver
    #                                         derives accelerate's worker environment from them
    forward_prefixes: list[str] = field(default_factory=lambda: list(FORWARD_PREFIXES))

    @property
    def stop_path(self) -> Path:
        return Path(self.spec_path).with_name(STOP_NAME)

    @property
    def attempts_dir(self) -> Path:
        return Path(self.spec_path).with_name(ATTEMPTS_DIR)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> "RayJob":
        return cls(**json.loads(Path(path).read_text()))


def wants_ray(recipe: Recipe, opts: object) -> bool:
    """Whether this launch starts its workers through Ray (`launch --ray`, or `distributed.launcher: ray`)."""
    from recipeforge.capabilities import Launcher

    return bool(getattr(opts, "ray", False)) or recipe.distributed.launcher == Launcher.RAY


def ray_address(recipe: Recipe, given: str | None = None) -> str:
    """The cluster: `--ray-address`, else the recipe's `distributed.ray_address`, else `RAY_ADDRESS`,
    else `auto` (a cluster started on this machine with `ray start --head`)."""
    from recipeforge.config.schema.rules import ray_address_ok

    address = given or recipe.distributed.ray_address or os.environ.get(ADDRESS_ENV) or "auto"
    if not ray_address_ok(address):
        raise RecipeError(f"'{address}' is not a Ray cluster address", key="distributed.ray_address",
                          hint="host:port of the head node (e.g. 10.0.0.1:6379), ray://host:10001, or auto")
    return address


def check_ray_installed() -> None:
    """A short error (exit 2) when Ray Train is not installed here; looked up, not imported."""
    from importlib.util import find_spec

    try:
        found = find_spec("ray") is not None and find_spec("ray.train") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise RecipeError("launching through Ray needs Ray Train, which is not installed",
                          key="distributed.launcher", hint=f"{INSTALL_HINT} (here and on the cluster's nodes)")


def ray_launch_spec(spec: LaunchSpec, plan: Plan, recipe: Recipe, *, run_dir: Path, address: str) -> LaunchSpec:
    """The backend's `LaunchSpec` (its files, its worker command) turned into a Ray driver's: the same
    files plus ``ray_job.json``, and the driver as the command `run_launcher` starts."""
    from recipeforge.backends.launch import LaunchSpec

    command = list(spec.command)
    from recipeforge.backends.worker_spec import WORKER_MODULE

    module = max(i for i in range(len(command) - 1) if command[i:i + 2] == ["-m", WORKER_MODULE])
    worker_argv = command[module + 2:]
    from recipeforge.backends.job_values import check_command_values

    # The job file sits in the run directory, which others read: no credential goes into it.
    check_command_values([(a.split("=", 1)[0], a) for a in worker_argv if "=" in a], where=f"{JOB_NAME}")
    accelerate_argv: list[str] = []
    if spec.launcher == "accelerate":  # [accelerate, launch, ...] or [python, -m, accelerate.commands.launch, ...]
        start = 3 if command[1:3] == ["-m", "accelerate.commands.launch"] else 2
        accelerate_argv = command[start:]
    cuda = plan.device == "cuda"
    assert spec.spec_path is not None  # a worker launch names its workers' spec (`launch.launch_spec`)
    job = RayJob(
        address=address, name=f"recipeforge-{Path(run_dir).name}", num_workers=plan.world_size, use_gpu=cuda,
        resources_per_worker={"CPU": 1.0, "GPU": 1.0} if cuda else {"CPU": 1.0},
        torch_backend="nccl" if cuda else "gloo",
        timeout_s=int(recipe.distributed.timeout_minutes * 60), max_failures=recipe.distributed.max_restarts,
        storage_path=str(Path(run_dir) / STORAGE_DIR), worker_argv=worker_argv,
        worker_env={k: v for k, v in spec.env.items() if k not in NOT_FORWARDED},
        spec_path=str(spec.spec_path), cwd=os.getcwd(), accelerate_argv=accelerate_argv)
    job_path = Path(spec.spec_path).with_name(JOB_NAME)
    files = {**spec.files, job_path: job.to_json()}
    driver = [sys.executable, "-m", "recipeforge.ray_entry", str(job_path)]
    return LaunchSpec("ray", driver, dict(spec.env), files, spec.plan_path, spec.spec_path)


def describe(job: RayJob) -> str:
    """One line for the log: where and how many."""
    per = ", ".join(f"{v:g} {k}" for k, v in job.resources_per_worker.items())
    return (f"Ray Train TorchTrainer on {job.address}: {job.num_workers} workers ({per} each, {job.torch_backend}), "
            f"max_failures={job.max_failures}; each runs the worker entry on {shlex.join(job.worker_argv)}")
