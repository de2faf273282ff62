"""What each training pod of `recipeforge launch --k8s` holds: its command, resources, volumes and env.

One pod per node, as one Slurm task per node: every pod runs the same `recipeforge train` on the
recipe mounted from a ConfigMap, with its run directory on a PersistentVolumeClaim, and passes the
node-level rendezvous the operator put in its environment on as `--nnodes/--node-rank/--master-addr/
--master-port` (Kubernetes expands ``$(NAME)`` in a container's command from its env). That
`recipeforge train` then writes the launch files and starts the plan's launcher for its local GPUs.
Nothing here imports torch: the manifests are written on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recipeforge.stage_specs import Names

if TYPE_CHECKING:
    from recipeforge.plan.types import Plan

RECIPE_DIR = "/etc/recipeforge"          # the ConfigMap's mount (read-only)
RECIPE_FILE = "recipe.yaml"              # the ConfigMap's key: the resolved recipe
RUNS_DIR = "/mnt/recipeforge"            # the PersistentVolumeClaim's mount: run directories and caches
SHM_DIR = "/dev/shm"                     # NCCL and the data loader's workers share memory through it
GPU_RESOURCE = "nvidia.com/gpu"          # the NVIDIA device plugin's extended resource
# Host memory a process needs besides what the plan offloads: the interpreter and libraries, CUDA's
# and NCCL's host buffers, data loader workers, pinned staging for checkpoints.
HOST_GB_PER_PROCESS = 8
# Where the image keeps downloads and compiled kernels (docker/Dockerfile puts them under /cache):
# moved onto the claim, so a rescheduled pod does not download the model again.
CACHE_ENV = {"HF_HOME": f"{RUNS_DIR}/cache/huggingface",
             "TORCH_EXTENSIONS_DIR": f"{RUNS_DIR}/cache/torch_extensions"}
# Node-level rank variables some operators set (PyTorchJob: WORLD_SIZE = pods x nprocPerNode, RANK =
# the pod's index). `recipeforge train` reads RANK/WORLD_SIZE as "I am a launched worker", so the
# launching command must not see them; it sets the per-process ones for its workers itself.
WORKER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class Volume(Names):
    """The pod's volumes."""

    RECIPE = "recipe"
    RUNS = "runs"
    SHM = "dshm"


@dataclass(frozen=True)
class Rendezvous:
    """The names of the environment variables an operator sets with the node-level rendezvous."""

    nnodes: str
    node_rank: str
    master_addr: str
    master_port: str


@dataclass(frozen=True)
class PodShape:
    """One pod (node) of the plan: how many of them, what each starts and what it needs."""

    nodes: int
    gpus: int                  # GPUs per pod; 0 for a CPU run
    processes: int             # training processes per pod
    memory_gib: int            # host memory request per pod
    gpu_memory_gb: float       # the plan's peak per GPU (for the reader: a pod cannot request it)


def pod_shape(plan: Plan) -> PodShape:
    """The pod of `plan`: its nodes, its GPUs per node, and host memory for its processes plus what
    the plan offloads to host RAM (on a CPU run the planned per-process memory is host RAM too)."""
    from recipeforge.plan.world import processes_per_node

    processes = processes_per_node(plan)
    host = plan.extra.cpu_memory_gb + HOST_GB_PER_PROCESS * processes
    if plan.device != "cuda":
        host += plan.memory_gb.get("total", 0.0) * processes
    gpus = plan.gpus_per_node if plan.device == "cuda" else 0
    return PodShape(nodes=plan.nodes, gpus=gpus, processes=processes, memory_gib=math.ceil(host),
                    gpu_memory_gb=plan.memory_gb.get("total", 0.0) if gpus else 0.0)


def train_command(shape: PodShape, rendezvous: Rendezvous, run_dir: str) -> list[str]:
    """The container's command: `recipeforge train` on the mounted recipe into `run_dir`, with the
    operator's rendezvous for a multi-node plan (one node needs none: it starts its launcher alone)."""
    unset = [arg for name in WORKER_ENV for arg in ("-u", name)]
    # The kubelet expands $(NAME) in a command from the container's environment: a literal '$' (in a run
    # directory's name) is written '$$'; the rendezvous references below are meant to expand.
    from recipeforge.backends.job_values import k8s_literal

    command = ["env", *unset, "recipeforge", "train", f"{RECIPE_DIR}/{RECIPE_FILE}",
               k8s_literal(f"output.dir={run_dir}")]
    if not shape.gpus:  # a CPU plan says its processes; a GPU plan starts one per GPU by itself
        command += ["--nproc-per-node", str(shape.processes)]
    if shape.nodes > 1:
        command += ["--nnodes", f"$({rendezvous.nnodes})", "--node-rank", f"$({rendezvous.node_rank})",
                    "--master-addr", f"$({rendezvous.master_addr})",
                    "--master-port", f"$({rendezvous.master_port})"]
    return command


def resources(shape: PodShape) -> dict[str, Any]:
    """Requests and limits of the training container. Memory is requested, not limited: the scheduler
    places the pod where the planned memory is free, and a spike above the estimate does not get the
    pod OOM-killed mid-step. GPUs are an extended resource: limits are required, requests must equal."""
    requests: dict[str, Any] = {"memory": f"{shape.memory_gib}Gi"}
    limits: dict[str, Any] = {}
    if shape.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = shape.gpus
    return {"requests": requests, "limits": limits} if limits else {"requests": requests}


def volumes(config_map: str, claim: str) -> list[dict[str, Any]]:
    """The recipe's ConfigMap, the run directories' claim, and a memory-backed /dev/shm (a container's
    default 64 MiB is too small for NCCL and data loader workers)."""
    return [{"name": str(Volume.RECIPE), "configMap": {"name": config_map}},
            {"name": str(Volume.RUNS), "persistentVolumeClaim": {"claimName": claim}},
            {"name": str(Volume.SHM), "emptyDir": {"medium": "Memory"}}]


def volume_mounts() -> list[dict[str, Any]]:
    """Where the training container sees the volumes of `volumes`."""
    return [{"name": str(Volume.RECIPE), "mountPath": RECIPE_DIR, "readOnly": True},
            {"name": str(Volume.RUNS), "mountPath": RUNS_DIR},
            {"name": str(Volume.SHM), "mountPath": SHM_DIR}]


def container_env() -> list[dict[str, str]]:
    """Environment of the training container besides what the operator adds."""
    # PYTHONUNBUFFERED is the image's (docker/Dockerfile) and PyTorchJob's own: not repeated here.
    return [{"name": name, "value": value} for name, value in CACHE_ENV.items()]
