"""`recipeforge launch --k8s`: the manifests validate against the published Kubeflow CRD schemas
(vendored under tests/data/k8s, see its SOURCE.md), and their pods carry the plan's numbers.

Every example recipe is written as a TrainJob and as a PyTorchJob, validated with `jsonschema`, and
compared with what the planner says for it: nodes, GPUs per node, host memory. The pod's command is
parsed by `recipeforge train`'s own argument parser, with the rendezvous variables the operator sets.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest


from recipeforge.backends.k8s import PYTORCH_CONTAINER, PYTORCH_PORT_NAME, RENDEZVOUS, TRAINJOB_NODE, K8sApi
from recipeforge.backends.k8s_pod import (GPU_RESOURCE, HOST_GB_PER_PROCESS, RECIPE_DIR, RECIPE_FILE, RUNS_DIR,
                                          WORKER_ENV)
from recipeforge.backends.slurm import SIGNAL_LEAD_S
from recipeforge.cli import build_parser, main
from recipeforge.config import load_recipe
from recipeforge.outputs.run_dir import default_run_dir
from recipeforge.plan.world import plan_for_world

from k8s_testing import check_config_map, check_job, crd_validator, manifests

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p for p in (ROOT / "examples" / "yaml").rglob("*.yaml")
                  if p.parent.name != "base" and p.name != "base.yaml")


@functools.cache
def planned(recipe: Path) -> dict:
    """The plan `recipeforge plan` prints for `recipe`, as JSON data."""
    return json.loads(json.dumps(plan_for_world(load_recipe(recipe).recipe).to_dict(), default=str))


def expected_pod(plan: dict) -> tuple[int, int, str]:
    """Nodes, GPUs per pod and host memory per pod the plan asks for."""
    gpus = plan["gpus_per_node"] if plan["device"] == "cuda" else 0
    processes = gpus or plan["extra"]["processes_per_node"] or plan["world_size"] // plan["nodes"]
    host = plan["extra"]["cpu_memory_gb"] + HOST_GB_PER_PROCESS * processes
    if not gpus:
        host += plan["memory_gb"]["total"] * processes
    return plan["nodes"], gpus, f"{math.ceil(host)}Gi"


def pods(job: dict, api: K8sApi) -> tuple[int, dict, dict, int]:
    """Pod count, the training container (merged with its TrainJob patch), the pod spec and the
    processes per node of a job."""
    if api == K8sApi.TRAINJOB:
        trainer = job["spec"]["trainer"]
        (patch,) = job["spec"]["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert rjob["name"] == TRAINJOB_NODE
        pod = rjob["template"]["spec"]["template"]["spec"]
        (patched,) = pod["containers"]
        assert patched["name"] == TRAINJOB_NODE
        container = {**trainer, "resources": trainer["resourcesPerNode"], **patched}
        return trainer["numNodes"], container, pod, trainer["numProcPerNode"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and set(replicas) <= {"Master", "Worker"}
    specs = [r["template"]["spec"] for r in replicas.values()]
    assert all(s == specs[0] for s in specs)  # every node runs the same pod
    (container,) = specs[0]["containers"]
    assert container["name"] == PYTORCH_CONTAINER
    assert container["ports"] == [{"name": PYTORCH_PORT_NAME, "containerPort": 29500}]
    return sum(r["replicas"] for r in replicas.values()), container, specs[0], int(job["spec"]["nprocPerNode"])


def check_mounts(container: dict, pod: dict, cm: dict) -> None:
    """The recipe the command reads is the ConfigMap's key, mounted; the run directory is on the claim."""
    by_name = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: by_name[m["name"]] for m in container["volumeMounts"]}
    assert mounts[RECIPE_DIR]["configMap"]["name"] == cm["metadata"]["name"] and RECIPE_FILE in cm["data"]
    assert mounts[RUNS_DIR]["persistentVolumeClaim"]["claimName"] == "runs"
    assert f"{RECIPE_DIR}/{RECIPE_FILE}" in container["command"]


def train_args(command: list[str], api: K8sApi, nodes: int):
    """The command as `recipeforge train` parses it, with the operator's variables expanded as the
    kubelet does; checks the variables are the ones the operator of `api` sets."""
    assert command[0] == "env" and command[1:1 + 2 * len(WORKER_ENV):2] == ["-u"] * len(WORKER_ENV)
    start = command.index("recipeforge") + 1
    values = dict(zip(vars(RENDEZVOUS[api]).values(), (str(nodes), "1", "master-0.svc", "29500")))
    used = set(re.findall(r"\$\((\w+)\)", " ".join(command)))
    assert used <= set(values), used
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in command[start:]]
    args, extra = build_parser().parse_known_args(expanded)
    assert args.command == "train" and not extra
    return args


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples" / "yaml")))
def test_every_example_validates_and_carries_its_plan(path, tmp_path):
    nodes, gpus, memory = expected_pod(planned(path))
    for api in K8sApi:
        cm, job = manifests(tmp_path, path, "--k8s-api", str(api))
        check_config_map(cm)
        check_job(job, api)
        count, container, pod, processes = pods(job, api)
        assert count == nodes
        assert container["resources"]["requests"]["memory"] == memory
        assert container["resources"].get("limits", {}).get(GPU_RESOURCE, 0) == gpus
        assert container["resources"]["requests"].get(GPU_RESOURCE, 0) == gpus
        assert processes == (gpus or planned(path)["world_size"] // nodes)
        assert pod["terminationGracePeriodSeconds"] == SIGNAL_LEAD_S
        check_mounts(container, pod, cm)
        args = train_args(container["command"], api, nodes)
        assert args.recipe == f"{RECIPE_DIR}/{RECIPE_FILE}"
        assert args.overrides == [f"output.dir={RUNS_DIR}/{default_run_dir(load_recipe(path).recipe, path).name}"]
        assert (args.nnodes, args.node_rank) == ((nodes, 1) if nodes > 1 else (None, None))


def test_multi_node_examples_are_covered():
    assert any(planned(p)["nodes"] > 1 for p in EXAMPLES) and any(planned(p)["device"] == "cpu" for p in EXAMPLES)
    assert any(planned(p)["device"] == "cuda" and planned(p)["nodes"] == 1 for p in EXAMPLES)


def test_the_config_map_holds_the_resolved_recipe(tmp_path):
    recipe = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"
    cm, _ = manifests(tmp_path, recipe, "train.learning_rate=2e-5")
    mounted = tmp_path / RECIPE_FILE
    mounted.write_text(cm["data"][RECIPE_FILE])
    assert load_recipe(mounted).recipe == load_recipe(recipe, ["train.learning_rate=2e-5"]).recipe


def test_grace_period_namespace_and_cpu_processes(tmp_path):
    recipe = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    cm, job = manifests(tmp_path, recipe, "--k8s-api", "pytorchjob", "--grace-period", "900", "--namespace",
                        "ml", "--nproc-per-node", "2", "train.micro_batch_size=auto")
    check_job(job, K8sApi.PYTORCHJOB)
    count, container, pod, processes = pods(job, K8sApi.PYTORCHJOB)
    assert pod["terminationGracePeriodSeconds"] == 900 and processes == 2
    assert cm["metadata"]["namespace"] == job["metadata"]["namespace"] == "ml"
    assert train_args(container["command"], K8sApi.PYTORCHJOB, count).nproc_per_node == 2


def test_local_data_files_are_warned_about(tmp_path, capsys):
    manifests(tmp_path, ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml")
    assert "sft-chat.jsonl' is a file on this machine" in capsys.readouterr().err


def test_a_recipe_with_secrets_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {ROOT / 'examples/yaml/tiny/sft-lora.yaml'}\nname: ${{env:HF_TOKEN}}\n")
    assert main(["launch", "--k8s", str(recipe), "--image", "i", "--pvc", "p"]) == 2
    err = capsys.readouterr().err
    assert "cannot go into a ConfigMap" in err and "hf_abcdefghijklmnop" not in err


def test_the_schemas_refuse_what_the_api_server_would():
    """The validators are not vacuous: a misspelled field, a wrong type and a missing field fail."""
    _, job = manifests_of(K8sApi.TRAINJOB)
    _, validator = crd_validator(K8sApi.TRAINJOB)
    bad = json.loads(json.dumps(job))
    bad["spec"]["trainer"]["numNode"] = bad["spec"]["trainer"].pop("numNodes")
    assert not validator.is_valid(bad)
    bad = json.loads(json.dumps(job))
    bad["spec"]["trainer"]["resourcesPerNode"]["requests"]["memory"] = "lots"
    assert not validator.is_valid(bad)
    _, job = manifests_of(K8sApi.PYTORCHJOB)
    _, validator = crd_validator(K8sApi.PYTORCHJOB)
    del job["spec"]["pytorchReplicaSpecs"]
    assert not validator.is_valid(job)


def manifests_of(api: K8sApi) -> list[dict]:
    from recipeforge.backends.k8s import K8sOptions, k8s_manifests

    loaded = load_recipe(ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml")
    return k8s_manifests(loaded, recipe=loaded.path, options=K8sOptions(image="i", pvc="p", api=api)).documents
