"""From a plan to running processes: the launcher command, its environment and generated files.

`recipeforge train` on one process trains in place. With more (or with DeepSpeed/FSDP/Megatron) it
writes the plan and the launcher's files, then starts the real launcher, one per node:

    accelerate launch --config_file RUN/accelerate_config.yaml [--machine_rank R --main_process_ip A
        --main_process_port P] -m recipeforge.run.worker RUN/worker.json
    torchrun --nnodes N --nproc_per_node G --node_rank R --master_addr A --master_port P -m recipeforge.run.worker ...

Each worker runs the worker entry on its `worker_spec.WorkerSpec` (``worker.json``: the plan this launch
was made for, the run directory, where to leave its outcome, the recipe and the launching command's
settings) and never plans again; the spec's path on its command line is all it is told (no
``RECIPEFORGE_*`` variable). The main node writes into the run directory; the other nodes keep their
copies in a node-local directory, so no node ever writes what another one reads.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from recipeforge.backends import elastic
from recipeforge.backends.cluster import ClusterSpec
from recipeforge.backends.launcher_command import launcher_command
from recipeforge.backends.worker_spec import OUTCOME_NAME, SPEC_NAME, WORKER_MODULE, WorkerSpec
from recipeforge.plan.world import processes_per_node
from recipeforge.settings import Settings

if TYPE_CHECKING:
    from types import FrameType

    from recipeforge.config.schema import Recipe
    from recipeforge.plan.types import Plan


@dataclass(frozen=True)
class LaunchSpec:
    """Everything `recipeforge train` does to start a multi-process run (and `--dry-run` prints)."""

    launcher: str                                   # accelerate | torchrun | none | ray (`ray_launch`)
    command: list[str]
    env: dict[str, str]                             # added to the inherited environment
    files: dict[Path, str] = field(default_factory=dict)   # written before the launcher starts
    plan_path: Path | None = None
    spec_path: Path | None = None                   # the workers' `WorkerSpec`

    @property
    def outcome_path(self) -> Path | None:
        """Where the workers leave their `Outcome` (next to their spec)."""
        return self.spec_path.with_name(OUTCOME_NAME) if self.spec_path is not None else None

    def render(self) -> str:
        """The dry-run text: command, environment, then every generated file with its content."""
        if self.launcher == "none":
            return "# no launcher: one process trains inside `recipeforge train` itself\n"
        from recipeforge.config.secrets import scrub

        # Printed, not run: a credential given as an override shows as <redacted>.
        lines = ["# command", scrub(shlex.join(self.command)), "", "# environment (added to the current one)"]
        lines += [scrub(f"{k}={shlex.quote(v)}") for k, v in sorted(self.env.items())]
        for path, text in self.files.items():
            if path == self.plan_path:  # long; `recipeforge plan --json` shows the same fields
                lines += ["", f"# file {path}", "(the plan summarised on the first line, as JSON)"]
            elif path == self.spec_path:  # the overrides it carries may hold a credential
                lines += ["", f"# file {path}", scrub(text.rstrip("\n"))]
            else:
                lines += ["", f"# file {path}", text.rstrip("\n")]
        return "\n".join(lines) + "\n"

    def write_files(self) -> None:
        """Write the generated files (atomically: a reader never sees half a file)."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.unlink(missing_ok=True)
            # The worker spec is this user's alone: a worker trusts no other (`WorkerSpec.read_trusted`).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if path == self.spec_path else 0o644)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)


def launch_spec(plan: Plan, recipe: Recipe, *, recipe_path: str, overrides: Sequence[str], run_dir: Path,
                cluster: ClusterSpec, files_dir: Path | None = None, settings: Settings | None = None,
                recipe_env: dict[str, str] | None = None) -> LaunchSpec:
    """The launch of `plan` on this node. `files_dir` is where this node's launch files go: the run
    directory on the main node (default), a node-local directory on the others. `settings` (the
    launching command's flags and environment) and `recipe_env` (the ``RECIPEFORGE_<SECTION>__KEY``
    overrides it applied) reach the workers in their spec, never through the environment."""
    from recipeforge.backends import get_backend

    backend = get_backend(plan.backend)
    backend.check(plan, recipe)
    launcher = backend.launcher(plan)
    where = Path(files_dir) if files_dir is not None else run_dir
    plan_path = where / "plan.json"
    files: dict[Path, str] = {plan_path: json.dumps(plan.to_dict(), indent=2, default=str) + "\n"}
    for name, text in backend.launch_files(plan, recipe).items():
        files[where / name] = text
    spec_path = where / SPEC_NAME
    spec = WorkerSpec(plan=str(plan_path), run_dir=str(Path(run_dir).absolute()), outcome=str(where / OUTCOME_NAME),
                      recipe=str(Path(recipe_path).absolute()), overrides=tuple(overrides),
                      recipe_env=dict(recipe_env or {}), settings=settings or Settings())
    files[spec_path] = spec.to_json()
    env = dict(backend.launch_env(plan))
    per_node = processes_per_node(plan)
    if plan.device != "cuda":
        # Several CPU processes on one machine: split the cores instead of each taking all of them.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // per_node)))
        env.update(cpu_engine_env())
    worker = ["-m", WORKER_MODULE, str(spec_path)]  # the one worker entry (`run.worker`)
    if launcher == "accelerate":
        cfg_path = where / "accelerate_config.yaml"
        files[cfg_path] = accelerate_config_text(plan, backend.accelerate_config(plan, recipe, where),
                                                 rdzv_backend=recipe.distributed.rdzv_backend)
        command = [*launcher_command("accelerate", "accelerate.commands.launch"), "--config_file", str(cfg_path)]
        if cluster.nnodes > 1:
            command += ["--machine_rank", str(cluster.node_rank), "--main_process_ip", cluster.master_addr,
                        "--main_process_port", str(cluster.master_port)]
        else:  # one machine: a free port, so runs side by side do not collide (unless one was given)
            command += ["--main_process_port", str(cluster.master_port if cluster.source != "local" else 0)]
        command += [*elastic.accelerate_args(recipe.distributed, cluster), *worker]
        env.update(elastic.accelerate_env(recipe.distributed, cluster, run_dir))
    elif launcher == "torchrun":
        command = [*launcher_command("torchrun", "torch.distributed.run"), "--nnodes", str(plan.nodes), "--nproc_per_node", str(per_node)]
        command += [*elastic.torchrun_args(recipe.distributed, cluster, run_dir), *worker]
    else:
        command = [sys.executable, *worker]
    return LaunchSpec(launcher, command, env, files, plan_path, spec_path)


def accelerate_config_text(plan: Plan, backend_section: dict[str, Any], *, rdzv_backend: str = "static") -> str:
    """The accelerate config file: the process layout from the plan plus the backend's section.
    (`accelerate launch` takes the rendezvous backend from its command line, `elastic.accelerate_args`;
    the file says the same, so a reader is not misled.)"""
    import yaml

    config = {"compute_environment": "LOCAL_MACHINE", **backend_section,
              "num_machines": plan.nodes, "num_processes": plan.world_size, "machine_rank": 0,
              "rdzv_backend": rdzv_backend, "same_network": True, "main_training_function": "main",
              "gpu_ids": "all", "use_cpu": False, "downcast_bf16": "no", "enable_cpu_affinity": False}
    if backend_section.get("distributed_type") != "DEEPSPEED":
        # DeepSpeed takes precision from its own file; accelerate refuses it in both places.
        precision = (plan.extra.dtype or "fp32") if plan.device == "cuda" else "fp32"
        config["mixed_precision"] = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    header = ("# Written by recipeforge from plan.json; `accelerate launch --config_file` reads it.\n"
              "# CPU run: accelerate starts one process per rank (torch's elastic launcher); they talk over gloo.\n"
              if plan.device != "cuda" else "# Written by recipeforge from plan.json.\n")
    if "parallelism_config" in backend_section:
        from recipeforge.backends.parallelism import describe

        header += f"# Mesh: {describe(plan)}\n"
    text: str = yaml.safe_dump(config, sort_keys=False)
    return header + text


# The launcher must not act on stop signals itself: torch's elastic agent would pass SIGTERM on and
# SIGKILL the workers 30 s later, whatever their checkpoint save still needs; SIGUSR1 would kill it.
# (torchrun/accelerate read PET_SIGNALS_TO_HANDLE for their --signals-to-handle option.)
LAUNCHER_ENV = {"PET_SIGNALS_TO_HANDLE": "SIGHUP,SIGQUIT", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGHUP,SIGQUIT"}
FORWARD_EVERY_S = 5.0   # a worker still importing ignores the signal; it is sent again until it exits


def cpu_engine_env() -> dict[str, str]:
    """Environment for a CPU run: DeepSpeed told its accelerator is the CPU (unless the user said
    otherwise), so it does not probe for GPUs and print that it found none on every import."""
    return {} if "DS_ACCELERATOR" in os.environ else {"DS_ACCELERATOR": "cpu"}


def run_launcher(spec: LaunchSpec, *, log: Callable[[str], None] | None = None, pass_fds: Sequence[int] = ()) -> int:
    """Write the files and run the launcher in the foreground; returns its exit code.

    SIGTERM, SIGUSR1 and Ctrl-C reach the workers, not the launcher: the launcher starts with them
    ignored, and this process sends them to the launcher's worker processes (SIGTERM for a Ctrl-C),
    then waits for the workers to save and exit. A second Ctrl-C kills the workers at once. `pass_fds`
    stay open in the launcher (the run directory's lock, held as long as it runs).
    """
    import signal
    import time

    spec.write_files()
    if log is not None:
        log(f"launching {spec.launcher}: {shlex.join(spec.command)}")
    env = {**os.environ, **LAUNCHER_ENV, **spec.env}
    stops: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stops.append(signum)

    import threading

    names = ("SIGTERM", "SIGUSR1", "SIGINT")
    previous = {getattr(signal, n): signal.getsignal(getattr(signal, n)) for n in names} \
        if threading.current_thread() is threading.main_thread() else {}
    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        proc = subprocess.Popen(spec.command, env=env, pass_fds=tuple(pass_fds), preexec_fn=_ignore_stop_signals)
        sent_at, handled, killed = 0.0, 0, False
        while True:
            try:
                return proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if not stops:
                continue
            if not killed and stops.count(signal.SIGINT) >= 2:
                if log is not None:
                    log("second Ctrl-C: killing the workers without saving")
                _signal_tree(proc.pid, signal.SIGKILL, recursive=True)
                killed = True
            elif not killed and (len(stops) > handled or time.monotonic() - sent_at > FORWARD_EVERY_S):
                first = stops[0]
                if handled == 0 and log is not None:
                    log(f"{signal.Signals(first).name} received: passing it to the workers, which save a "
                        "checkpoint and stop" + (" (Ctrl-C again kills them)" if first == signal.SIGINT else ""))
                # A Ray driver passes the stop on to its workers itself (they run on the cluster's nodes).
                _signal_tree(proc.pid, signal.SIGTERM if first == signal.SIGINT else first,
                             include_root=spec.launcher not in ("accelerate", "torchrun"),
                             children=spec.launcher != "ray")
                sent_at, handled = time.monotonic(), len(stops)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _ignore_stop_signals() -> None:
    """In the launcher's process, before exec: stop signals ignored (dispositions that survive exec),
    and SIGHUP when this process dies: the launcher then stops its workers (`backends.parent_death`)."""
    import signal

    from recipeforge.backends.parent_death import end_with_parent

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    end_with_parent(signal.SIGHUP)


def _signal_tree(pid: int, sig: int, *, recursive: bool = False, include_root: bool = True,
                 children: bool = True) -> None:
    """Send `sig` to the children of the launcher `pid` (its workers; with `recursive`, everything
    below; none without `children`) and, with `include_root`, to `pid` itself (a worker started
    without a launcher, a Ray driver)."""
    import psutil

    try:
        root = psutil.Process(pid)
        targets = [root] if include_root else []
        targets += root.children(recursive=recursive) if children or recursive else []
    except psutil.Error:
        return
    for proc in targets:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
