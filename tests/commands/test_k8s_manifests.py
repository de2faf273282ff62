"""`recipeforge launch --k8s` as a user types it: the files it writes, the exit code and one-line errors
of bad arguments and recipes, and no training library imported (the manifests against the published
Kubeflow CRD schemas: tests/unit/backends/test_k8s_manifests.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from recipeforge.backends.k8s import PYTORCH_CONTAINER, PYTORCH_PORT_NAME, TRAINJOB_NODE, K8sApi

from k8s_testing import check_config_map, check_job

ROOT = Path(__file__).resolve().parents[2]


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


BAD = [
    (["--k8s-api", "mpijob", "--image", "i", "--pvc", "p"], "--k8s-api: 'mpijob' is not one of trainjob, pytorchjob"),
    (["--pvc", "p"], "--image: needed with --k8s"),
    (["--image", "i"], "--pvc: needed with --k8s"),
    (["--image", "i", "--pvc", "p", "--partition", "gpu"], "--partition is for launch --slurm only"),
    (["--image", "i", "--pvc", "p", "--grace-period", "0"], "--grace-period: must be 1 second or more"),
]


def test_the_command_as_typed(tmp_path):
    recipe = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"
    cmd = [sys.executable, "-m", "recipeforge", "launch", "--k8s", str(recipe), "--image", "acme/rf:1",
           "--pvc", "runs"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    cm, job = yaml.safe_load_all(proc.stdout)  # stdout holds the manifests and nothing else
    check_config_map(cm)
    check_job(job, K8sApi.TRAINJOB)
    out = tmp_path / "job.yaml"
    proc = subprocess.run([*cmd, "--k8s-api", "pytorchjob", "-o", str(out)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and f"kubectl apply -f {out}" in proc.stdout, proc.stderr
    check_job(list(yaml.safe_load_all(out.read_text()))[1], K8sApi.PYTORCHJOB)


def test_launch_k8s_imports_no_training_library(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from recipeforge.cli import main
        assert main(["launch", "--k8s", {str(ROOT / "examples/yaml/llama3-70b-full-sft.yaml")!r}, "--image", "i",
                     "--pvc", "p", "--k8s-api", "pytorchjob", "-o", {str(tmp_path / "job.yaml")!r}]) == 0
        heavy = sorted(m for m in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets")
                       if m in sys.modules)
        print("HEAVY", heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


@pytest.mark.parametrize("args,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_arguments_exit_2_with_one_line(args, message):
    recipe = ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "launch", "--k8s", str(recipe), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), proc.stderr


def test_a_recipe_error_exits_2_without_traceback(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(f"extends: {ROOT / 'examples/yaml/tiny/sft-lora.yaml'}\ntrain: {{learning_rate: -1}}\n")
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "launch", "--k8s", str(recipe), "--image", "i",
                           "--pvc", "p"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and "learning_rate" in proc.stderr.splitlines()[0]
