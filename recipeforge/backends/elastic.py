"""Elastic restarts and rendezvous: the recipe's `distributed.max_restarts` / `rdzv_*` keys as the
launcher's arguments.

Both launchers end in torch's elastic agent (`torch.distributed.run`): torchrun takes the keys as
flags; `accelerate launch` has flags for the restart count and the rendezvous backend only, and hands
the rest of torchrun's options over from torch's own ``PET_<OPTION>`` environment defaults (its
argument parser reads them), so the endpoint and id travel that way. The agent restarts the whole
worker group up to `max_restarts` times after a worker fails; each restarted worker resumes from the
newest complete checkpoint (`run.restarts`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends.cluster import ClusterSpec

if TYPE_CHECKING:
    from datetime import timedelta

    from recipeforge.config.schema import DistributedConfig

STATIC = "static"
LOCAL_ENDPOINT = "localhost:0"   # one machine without an endpoint: the agent hosts the store on a free port


def rdzv_id(distributed: DistributedConfig, run_dir: Path) -> str:
    """The id every node of this launch shares: the recipe's, or one derived from the run directory
    (every node of a run names the same absolute directory; two runs never meet under one id)."""
    if distributed.rdzv_id:
        return str(distributed.rdzv_id)
    return "recipeforge-" + hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:12]


def is_elastic_rendezvous(distributed: DistributedConfig) -> bool:
    """Whether the nodes meet through a rendezvous backend rather than fixed ranks at the master address."""
    return distributed.rdzv_backend != STATIC


def endpoint(distributed: DistributedConfig) -> str:
    """The rendezvous endpoint: the recipe's, else (one machine) a store the agent hosts itself."""
    if distributed.rdzv_endpoint:
        return str(distributed.rdzv_endpoint)
    # validation refuses etcd, and c10d across nodes, without an endpoint
    return LOCAL_ENDPOINT


def torchrun_args(distributed: DistributedConfig, cluster: ClusterSpec, run_dir: Path) -> list[str]:
    """torchrun's node, rendezvous and restart flags (after --nnodes/--nproc_per_node)."""
    out = ["--max-restarts", str(distributed.max_restarts)] if distributed.max_restarts else []
    if is_elastic_rendezvous(distributed):
        # Node ranks come from the rendezvous (a replaced node joins under a new one), so none is passed.
        return out + ["--rdzv-backend", distributed.rdzv_backend, "--rdzv-endpoint", endpoint(distributed),
                      "--rdzv-id", rdzv_id(distributed, run_dir)]
    if cluster.nnodes > 1:
        return out + ["--node_rank", str(cluster.node_rank), "--master_addr", cluster.master_addr,
                      "--master_port", str(cluster.master_port)]
    return out + ["--standalone"]


def accelerate_args(distributed: DistributedConfig, cluster: ClusterSpec) -> list[str]:
    """`accelerate launch` flags for restarts and the rendezvous backend (the endpoint and id go by
    `accelerate_env`)."""
    out = ["--max_restarts", str(distributed.max_restarts)] if distributed.max_restarts else []
    if is_elastic_rendezvous(distributed):
        out += ["--rdzv_backend", distributed.rdzv_backend]
        if cluster.nnodes > 1:
            # Otherwise accelerate makes the main process's address the rendezvous endpoint, over the recipe's.
            out += ["--same_network"]
    return out


def accelerate_env(distributed: DistributedConfig, cluster: ClusterSpec, run_dir: Path) -> dict[str, str]:
    """torchrun options accelerate has no flag for, as the ``PET_*`` defaults torch's parser reads."""
    if not is_elastic_rendezvous(distributed):
        return {}
    return {"PET_RDZV_ENDPOINT": endpoint(distributed), "PET_RDZV_ID": rdzv_id(distributed, run_dir)}


def attempt_store_kwargs(timeout: timedelta | None = None) -> dict[str, Any]:
    """`init_process_group` arguments for a restarted worker: the agent's store under a prefix of this
    attempt. The agent keeps one store for every attempt of a launch (``TORCHELASTIC_USE_AGENT_STORE``),
    and a process group joined again under the same keys can read a peer's address left there by the
    failed attempt, then fail to connect to a process that no longer exists. Empty for a first attempt
    and where each attempt gets a fresh store."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0") or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timeout or timedelta(minutes=30)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return {"store": dist.PrefixStore(f"recipeforge/attempt_{attempt}", store),
            "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
