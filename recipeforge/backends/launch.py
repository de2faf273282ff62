"""From a plan to running processes: the launcher command, its environment and generated files.

`recipeforge train` on one process trains in place. With more (or with DeepSpeed/FSDP/Megatron) it
writes the plan and the launcher's files, then starts the real launcher, one per node:

    accelerate launch --config_file RUN/accelerate_config.yaml [--machine_rank R --main_process_ip A
        --main_process_port P] -m recipeforge train RECIPE [key=value ...]
    torchrun --nnodes N --nproc_per_node G --node_rank R --master_addr A --master_port P -m recipeforge train ...

Each worker finds ``RECIPEFORGE_PLAN`` (the plan this launch was made for) in its environment and
never plans again. The main node writes into the run directory; the other nodes keep their copies in
a node-local directory, so no node ever writes what another one reads.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from recipeforge.backends.cluster import ClusterSpec
from recipeforge.backends.world import processes_per_node

PLAN_ENV = "RECIPEFORGE_PLAN"          # path of the plan a launched worker runs
RUN_DIR_ENV = "RECIPEFORGE_RUN_DIR"    # the run directory the launching command prepared


@dataclass(frozen=True)
class LaunchSpec:
    """Everything `recipeforge train` does to start a multi-process run (and `--dry-run` prints)."""

    launcher: str                                   # accelerate | torchrun | none
    command: list[str]
    env: dict[str, str]                             # added to the inherited environment
    files: dict[Path, str] = field(default_factory=dict)   # written before the launcher starts
    plan_path: Path | None = None

    def render(self) -> str:
        """The dry-run text: command, environment, then every generated file with its content."""
        if self.launcher == "none":
            return "# no launcher: one process trains inside `recipeforge train` itself\n"
        lines = ["# command", shlex.join(self.command), "", "# environment (added to the current one)"]
        lines += [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        for path, text in self.files.items():
            if path == self.plan_path:  # long; `recipeforge plan --json` shows the same fields
                lines += ["", f"# file {path}", "(the plan summarised on the first line, as JSON)"]
            else:
                lines += ["", f"# file {path}", text.rstrip("\n")]
        return "\n".join(lines) + "\n"

    def write_files(self) -> None:
        """Write the generated files (atomically: a reader never sees half a file)."""
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)


def launch_spec(plan, recipe, *, recipe_path: str, overrides: Sequence[str], run_dir: Path,
                cluster: ClusterSpec, files_dir: Path | None = None, debug: bool = False) -> LaunchSpec:
    """The launch of `plan` on this node. `files_dir` is where this node's launch files go: the run
    directory on the main node (default), a node-local directory on the others."""
    from recipeforge.backends import get_backend

    backend = get_backend(plan.backend)
    backend.check(plan, recipe)
    launcher = backend.launcher(plan)
    where = Path(files_dir) if files_dir is not None else run_dir
    plan_path = where / "plan.json"
    files: dict[Path, str] = {plan_path: json.dumps(plan.to_dict(), indent=2, default=str) + "\n"}
    for name, text in backend.launch_files(plan, recipe).items():
        files[where / name] = text
    env = {PLAN_ENV: str(plan_path), RUN_DIR_ENV: str(run_dir), **backend.launch_env(plan)}
    per_node = processes_per_node(plan)
    if plan.device != "cuda":
        # Several CPU processes on one machine: split the cores instead of each taking all of them.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // per_node)))
    worker = ["-m", "recipeforge", *(["--debug"] if debug else []), "train", str(recipe_path), *overrides]
    if launcher == "accelerate":
        cfg_path = where / "accelerate_config.yaml"
        files[cfg_path] = accelerate_config_text(plan, backend.accelerate_config(plan, recipe, where))
        command = [_executable("accelerate"), "launch", "--config_file", str(cfg_path)]
        if cluster.nnodes > 1:
            command += ["--machine_rank", str(cluster.node_rank), "--main_process_ip", cluster.master_addr,
                        "--main_process_port", str(cluster.master_port)]
        else:  # one machine: a free port, so runs side by side do not collide (unless one was given)
            command += ["--main_process_port", str(cluster.master_port if cluster.source != "local" else 0)]
        command += worker
    elif launcher == "torchrun":
        command = [_executable("torchrun"), "--nnodes", str(plan.nodes), "--nproc_per_node", str(per_node)]
        if cluster.nnodes > 1:
            command += ["--node_rank", str(cluster.node_rank), "--master_addr", cluster.master_addr,
                        "--master_port", str(cluster.master_port)]
        else:
            command += ["--standalone"]
        command += worker
    else:
        command = [sys.executable, *worker]
    return LaunchSpec(launcher, command, env, files, plan_path)


def accelerate_config_text(plan, backend_section: dict) -> str:
    """The accelerate config file: the process layout from the plan plus the backend's section."""
    import yaml

    config = {"compute_environment": "LOCAL_MACHINE", **backend_section,
              "num_machines": plan.nodes, "num_processes": plan.world_size, "machine_rank": 0,
              "rdzv_backend": "static", "same_network": True, "main_training_function": "main",
              "gpu_ids": "all", "use_cpu": False, "downcast_bf16": "no", "enable_cpu_affinity": False}
    if backend_section.get("distributed_type") != "DEEPSPEED":
        # DeepSpeed takes precision from its own file; accelerate refuses it in both places.
        precision = plan.extra.get("dtype", "fp32") if plan.device == "cuda" else "fp32"
        config["mixed_precision"] = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    header = ("# Written by recipeforge from plan.json; `accelerate launch --config_file` reads it.\n"
              "# CPU run: accelerate starts one process per rank (torch's elastic launcher); they talk over gloo.\n"
              if plan.device != "cuda" else "# Written by recipeforge from plan.json.\n")
    return header + yaml.safe_dump(config, sort_keys=False)


def _executable(name: str) -> str:
    """The launcher installed next to this Python (a venv need not be on PATH), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    return shutil.which(name) or name


def run_launcher(spec: LaunchSpec, *, log=None) -> int:
    """Write the files and run the launcher in the foreground; returns its exit code."""
    spec.write_files()
    if log is not None:
        log(f"launching {spec.launcher}: {shlex.join(spec.command)}")
    env = {**os.environ, **spec.env}
    try:
        return subprocess.run(spec.command, env=env).returncode
    except KeyboardInterrupt:
        return 130
