"""`recipeforge launch` from a machine without the cluster's GPUs (a login node), on a recipe shaped the way
users write them (no `hardware:` section): `--hardware` plans the job for the cluster's nodes, and every
node's `recipeforge train` plans for the same hardware. Without it the refusal names the flag."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import yaml

RECIPE = """\
stage: sft
model: {name_or_path: meta-llama/Llama-3.1-8B}
adapter: {type: lora}
data: {datasets: [{path: HuggingFaceH4/ultrachat_200k, split: train_sft, format: messages}]}
"""


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_slurm_job_planned_for_the_named_nodes(tmp_path):
    (tmp_path / "lora.yaml").write_text(RECIPE)
    done = _run("launch", "--slurm", "lora.yaml", "--hardware", "2x8xH100-80GB", "-o", "job.sbatch", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun.rstrip(" &"))
    overrides = words[words.index("train") + 2:]
    # What each node's train plans is the plan the script was written for.
    plan = _run("plan", "lora.yaml", *overrides, "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    got = json.loads(plan.stdout)
    assert (got["nodes"], got["gpus_per_node"]) == (2, 8)


def test_k8s_job_planned_for_the_named_nodes(tmp_path):
    (tmp_path / "lora.yaml").write_text(RECIPE)
    done = _run("launch", "--k8s", "lora.yaml", "--hardware", "2x8xH100-80GB", "--image", "img:1", "--pvc", "runs",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config_map, job = list(yaml.safe_load_all(done.stdout))
    assert yaml.safe_load(next(iter(config_map["data"].values())))["hardware"]["gpus_per_node"] == 8
    assert job["spec"]["trainer"]["numNodes"] == 2


def test_without_it_the_refusal_names_the_flag(tmp_path):
    (tmp_path / "lora.yaml").write_text(RECIPE)
    done = _run("launch", "--slurm", "lora.yaml", cwd=tmp_path)
    if done.returncode == 0:  # this machine has the GPUs: nothing to refuse
        return
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--hardware" in done.stderr and "launch" in done.stderr
