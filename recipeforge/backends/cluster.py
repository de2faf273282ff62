"""Where this node sits in a multi-node job: from command-line flags, else from Slurm's environment."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from recipeforge.errors import RecipeError

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class ClusterSpec:
    """The node-level rendezvous of a job (one launcher per node)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    source: str = "local"  # "local" | "flags" | "slurm"

    @property
    def is_main_node(self) -> bool:
        return self.node_rank == 0


def detect_cluster(nnodes: int | None = None, node_rank: int | None = None, master_addr: str | None = None,
                   master_port: int | None = None, environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """Flags win; otherwise a Slurm allocation (SLURM_JOB_NUM_NODES > 1) is used; otherwise one node."""
    env = os.environ if environ is None else environ
    if nnodes is None and _int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1) > 1:
        spec = ClusterSpec(
            nnodes=_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1),
            node_rank=_int(env, "SLURM_NODEID", default=0),
            master_addr=env.get("MASTER_ADDR") or first_host(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", ""))),
            master_port=int(env.get("MASTER_PORT", DEFAULT_PORT)),
            source="slurm")
    else:
        spec = ClusterSpec(nnodes=nnodes or 1, node_rank=node_rank or 0,
                           master_addr=master_addr or env.get("MASTER_ADDR", "127.0.0.1"),
                           master_port=master_port or int(env.get("MASTER_PORT", DEFAULT_PORT)),
                           source="flags" if nnodes else "local")
    _check(spec)
    return spec


def _check(spec: ClusterSpec) -> None:
    if spec.nnodes < 1:
        raise RecipeError(f"--nnodes must be >= 1 (got {spec.nnodes})")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise RecipeError(f"--node-rank must be in 0..{spec.nnodes - 1} (got {spec.node_rank})",
                          hint="each node of the job gets its own rank, the main node 0")
    if spec.nnodes > 1 and not spec.master_addr:
        raise RecipeError("multi-node runs need --master-addr (the main node's hostname or IP)")
    if not 0 < spec.master_port < 65536:
        raise RecipeError(f"--master-port must be a TCP port (got {spec.master_port})")


def _int(env: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        value = env.get(name)
        if value and value.strip().isdecimal():
            return int(value)
    return default


def first_host(nodelist: str) -> str:
    """The first hostname of a Slurm node list: ``gpu[003-005,009],cpu1`` -> ``gpu003``."""
    nodelist = nodelist.strip()
    if not nodelist:
        return ""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        return nodelist.split(",")[0]
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"
