"""`recipeforge launch --k8s`: Kubernetes manifests for a recipe's plan, one multi-document YAML file.

Two objects: a ConfigMap holding the resolved recipe, and the job, either a Kubeflow Trainer v2
`TrainJob` (trainer.kubeflow.org/v1alpha1, on the `torch-distributed` ClusterTrainingRuntime) or a
Kubeflow Training Operator `PyTorchJob` (kubeflow.org/v1). Both run one pod per planned node with the
plan's GPUs and host memory; each pod's `recipeforge train` (see `k8s_pod`) reads the node-level
rendezvous from the operator's environment, as under Slurm it reads it from Slurm's.

Preemption: Kubernetes sends SIGTERM when it deletes a pod (preemption, drain, `kubectl delete`) and
SIGKILLs it `terminationGracePeriodSeconds` later. `recipeforge train` saves a checkpoint on SIGTERM
and exits with 75, so the grace period is the time Slurm's script gives ahead of its time limit
(`slurm.SIGNAL_LEAD_S`) unless `--grace-period` says otherwise. The run directory lives on the claim,
so a rerun of the job resumes from the newest checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.backends import job_values
from recipeforge.backends.cluster import DEFAULT_PORT
from recipeforge.backends.k8s_pod import (RECIPE_FILE, RUNS_DIR, PodShape, Rendezvous, container_env, pod_shape,
                                          resources, train_command, volume_mounts, volumes)
from recipeforge.backends.slurm import SIGNAL_LEAD_S
from recipeforge.errors import RecipeError
from recipeforge.stage_specs import Names

if TYPE_CHECKING:
    from recipeforge.config.pipeline import LoadedRecipe


class K8sApi(Names):
    """The job kinds `--k8s-api` writes."""

    TRAINJOB = "trainjob"
    PYTORCHJOB = "pytorchjob"


TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
PYTORCHJOB_API = "kubeflow.org/v1"
DEFAULT_RUNTIME = "torch-distributed"   # the ClusterTrainingRuntime Kubeflow Trainer installs for torch
TRAINJOB_NODE = "node"                  # the runtime's replicated job and its trainer container
PYTORCH_CONTAINER = "pytorch"           # the container the operator reads the master port from ...
PYTORCH_PORT_NAME = "pytorchjob-port"   # ... through a port of this name
PATCH_MANAGER = "recipeforge"           # owner of the TrainJob's runtime patch
# Pods restarted before the job counts as failed: each preemption uses one, so spot nodes need a few.
BACKOFF_LIMIT = 10
# Pod and service names append "-node-0-0" / "-worker-12" to the job's name and must stay DNS labels
# (63 characters): the job's name keeps room for them.
MAX_NAME = 40
# What each kind's operator puts in the pod's environment for the node-level rendezvous.
RENDEZVOUS = {K8sApi.TRAINJOB: Rendezvous("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
              K8sApi.PYTORCHJOB: Rendezvous("PET_NNODES", "PET_NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}


@dataclass(frozen=True)
class K8sOptions:
    """Cluster settings that are not part of the recipe."""

    image: str
    pvc: str
    api: K8sApi = K8sApi.TRAINJOB
    namespace: str | None = None
    runtime: str = DEFAULT_RUNTIME
    grace_period: int = SIGNAL_LEAD_S
    port: int = DEFAULT_PORT  # PyTorchJob: the master's rendezvous port (TrainJob's runtime sets its own)


def parse_api(value: str) -> K8sApi:
    """`--k8s-api` as a `K8sApi`; a RecipeError naming the choices otherwise."""
    try:
        return K8sApi(value.strip().lower())
    except ValueError:
        raise RecipeError(f"{value!r} is not one of " + ", ".join(str(a) for a in K8sApi),
                          key="--k8s-api") from None


def job_name(text: str) -> str:
    """`text` as a name every Kubeflow object accepts: an RFC 1035 label (lowercase letters, digits and
    '-', starting with a letter), short enough for the pod names derived from it."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)
    return (name or "recipeforge")[:MAX_NAME].rstrip("-")


def _metadata(name: str, options: K8sOptions, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/created-by": "recipeforge"}}
    if options.namespace:
        meta["namespace"] = options.namespace
    if annotations:
        meta["annotations"] = annotations
    return meta


def config_map(name: str, recipe_text: str, options: K8sOptions) -> dict[str, Any]:
    """The ConfigMap holding the resolved recipe, mounted read-only in every pod."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(name, options),
            "data": {RECIPE_FILE: recipe_text}}


def trainjob(name: str, shape: PodShape, command: list[str], recipe_map: str, options: K8sOptions,
             annotations: dict[str, str]) -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob: the trainer's image, command, nodes and resources, and a runtime
    patch for what the trainer section cannot say (volumes, mounts, the grace period)."""
    pod = {"terminationGracePeriodSeconds": options.grace_period, "volumes": volumes(recipe_map, options.pvc),
           "containers": [{"name": TRAINJOB_NODE, "volumeMounts": volume_mounts()}]}
    patch = {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": TRAINJOB_NODE, "template": {"spec": {"template": {"spec": pod}}}}]}}}}
    # numProcPerNode (PyTorchJob: nprocPerNode) reaches the pod as PET_NPROC_PER_NODE, a default torchrun
    # reads: the plan's count keeps it in agreement with what the pod's `recipeforge train` starts.
    trainer = {"image": options.image, "command": command, "env": container_env(), "numNodes": shape.nodes,
               "numProcPerNode": shape.processes, "resourcesPerNode": resources(shape)}
    return {"apiVersion": TRAINJOB_API, "kind": "TrainJob", "metadata": _metadata(name, options, annotations),
            "spec": {"runtimeRef": {"name": options.runtime}, "trainer": trainer, "runtimePatches": [patch]}}


def pytorchjob(name: str, shape: PodShape, command: list[str], recipe_map: str, options: K8sOptions,
               annotations: dict[str, str]) -> dict[str, Any]:
    """A Kubeflow Training Operator PyTorchJob: a Master pod (rank 0, whose service is MASTER_ADDR) and
    nodes - 1 Worker pods, all alike."""
    container = {"name": PYTORCH_CONTAINER, "image": options.image, "command": command, "env": container_env(),
                 "ports": [{"name": PYTORCH_PORT_NAME, "containerPort": options.port}],
                 "resources": resources(shape), "volumeMounts": volume_mounts()}
    pod = {"terminationGracePeriodSeconds": options.grace_period, "containers": [container],
           "volumes": volumes(recipe_map, options.pvc)}

    # OnFailure: a pod that stopped (preempted, exit 75) is started again and resumes from the
    # checkpoint; BACKOFF_LIMIT bounds a pod that fails for good.
    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": pod}}

    replicas = {"Master": replica(1)}
    if shape.nodes > 1:
        replicas["Worker"] = replica(shape.nodes - 1)
    spec = {"nprocPerNode": str(shape.processes), "runPolicy": {"backoffLimit": BACKOFF_LIMIT},
            "pytorchReplicaSpecs": replicas}
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob", "metadata": _metadata(name, options, annotations),
            "spec": spec}


JOB_WRITERS = {K8sApi.TRAINJOB: trainjob, K8sApi.PYTORCHJOB: pytorchjob}


@dataclass(frozen=True)
class Manifests:
    """The objects of one launch, and what the user should know before applying them."""

    documents: list[dict[str, Any]]
    warnings: list[str]


def k8s_manifests(loaded: LoadedRecipe, *, recipe: str, options: K8sOptions,
                  nproc_per_node: int | None = None) -> Manifests:
    """Plan `loaded` as `launch --slurm` does and build its ConfigMap and job."""
    from recipeforge.backends.slurm import layout_lines
    from recipeforge.config.secrets import public
    from recipeforge.outputs.run_dir import default_run_dir
    from recipeforge.plan.world import plan_for_world

    _check_options(options)
    r = loaded.recipe
    plan = plan_for_world(r, nproc_per_node=nproc_per_node)
    shape = pod_shape(plan)
    name = job_name(public(loaded, ("name",), r.name) or Path(recipe).stem)
    run_name = default_run_dir(r, Path(loaded.path)).name
    job_values.check_command_values([("output.dir", run_name)], where="the Kubernetes manifests")
    run_dir = f"{RUNS_DIR}/{run_name}"
    command = train_command(shape, RENDEZVOUS[options.api], run_dir)
    annotations = {"recipeforge/plan": "; ".join(layout_lines(plan)), "recipeforge/run-dir": run_dir}
    if shape.gpus:
        annotations["recipeforge/gpu-memory-gb"] = f"{shape.gpu_memory_gb:g}"
    recipe_map = f"{name}-recipe"
    job = JOB_WRITERS[options.api](name, shape, command, recipe_map, options, annotations)
    return Manifests([config_map(recipe_map, recipe_text(loaded), options), job], local_paths(loaded))


def _check_options(options: K8sOptions) -> None:
    # One line each, no hint: the flag's help says the rest.
    if not options.image.strip():
        raise RecipeError("needed with --k8s: the container image every pod runs, with recipeforge installed "
                          "(docker/Dockerfile builds one)", key="--image")
    if not options.pvc.strip():
        raise RecipeError("needed with --k8s: the PersistentVolumeClaim that keeps the run directory "
                          "(checkpoints must outlive a preempted pod)", key="--pvc")
    # Names and references as the API server and the container runtime parse them (job_values).
    job_values.image_reference(options.image, "--image")
    job_values.dns_subdomain(options.pvc, "--pvc")
    if options.namespace is not None:
        job_values.dns_label(options.namespace, "--namespace")
    job_values.dns_subdomain(options.runtime, "runtime")
    if options.grace_period < 1:
        raise RecipeError(f"must be 1 second or more (got {options.grace_period})", key="--grace-period")
    if not 0 < options.port < 65536:
        raise RecipeError(f"must be a TCP port (got {options.port})", key="--master-port")


def recipe_text(loaded: LoadedRecipe) -> str:
    """The resolved recipe for the ConfigMap. A recipe with secrets (values from secret environment
    variables, credentials written in it) is refused: a ConfigMap is readable by whoever can read the
    namespace, and the redacted copy would not run."""
    from recipeforge.config.dump import dump_recipe, recipe_to_data, resolved_data

    shown, real = resolved_data(loaded), recipe_to_data(loaded.recipe)
    if shown != real:
        keys = _differing_keys(shown, real)
        where = ", ".join(keys[:5]) or "values read from secret environment variables"
        raise RecipeError(f"the recipe holds secrets ({where}: credentials written in it or read from secret "
                          "variables); they cannot go into a ConfigMap", key=keys[0] if len(keys) == 1 else None,
                          hint="give the pods the tokens through their environment from a Kubernetes Secret "
                               "(HF_TOKEN, WANDB_API_KEY, ...) and leave them out of the recipe")
    return dump_recipe(loaded)


def _differing_keys(a: object, b: object, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two recipe data trees (where a secret was redacted)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [k for key in a if key in b for k in _differing_keys(a[key], b[key], f"{path}.{key}" if path else str(key))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [k for i, (x, y) in enumerate(zip(a, b)) for k in _differing_keys(x, y, f"{path}[{i}]")]
    return [] if a == b else [path or "(the recipe)"]


def local_paths(loaded: LoadedRecipe) -> list[str]:
    """Warnings for datasets read from this machine's files: the pods see only the image and the claim."""
    base = Path(loaded.path).parent
    data = loaded.recipe.data
    out = []
    for ds in [*(getattr(data, "datasets", None) or []), *(getattr(data, "eval_datasets", None) or [])]:
        path = str(getattr(ds, "path", "") or "")
        local = Path(path).expanduser()
        if path and not path.startswith(RUNS_DIR) and (local if local.is_absolute() else base / local).exists():
            out.append(f"data path {path!r} is a file on this machine; the pods cannot read it. Copy it onto "
                       f"the claim and point the recipe at {RUNS_DIR}/...")
    return out


def render_documents(documents: list[dict[str, Any]], source: str) -> str:
    """Multi-document YAML of `documents` for `kubectl apply -f`, multi-line strings (the recipe) as
    literal blocks so the ConfigMap reads like the recipe file."""
    import yaml

    # A subclass: the representer below stays out of PyYAML's global SafeDumper.
    class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
        pass

    def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    _Dumper.add_representer(str, _text)
    body = yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return f"# Written by recipeforge launch --k8s from {source}; apply with: kubectl apply -f FILE\n---\n{body}"
