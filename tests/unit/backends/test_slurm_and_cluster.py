"""Multi-node rendezvous from flags or Slurm, and `recipeforge launch --slurm`."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.backends.cluster import detect_cluster, first_host
from recipeforge.cli import main
from recipeforge.errors import RecipeError

ROOT = Path(__file__).resolve().parents[3]


def test_slurm_environment_is_detected_and_flags_win():
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[003-005,009]"}
    spec = detect_cluster(environ=env)
    assert (spec.nnodes, spec.node_rank, spec.master_addr, spec.source) == (2, 1, "gpu003", "slurm")
    assert detect_cluster(nnodes=4, node_rank=3, master_addr="h0", environ=env).source == "flags"
    assert detect_cluster(environ={}).source == "local"
    assert first_host("a1,b2") == "a1" and first_host("node[10-12]") == "node10"
    with pytest.raises(RecipeError, match="--node-rank must be in 0..1"):
        detect_cluster(nnodes=2, node_rank=2, master_addr="h0", environ={})


def test_sbatch_script_for_two_gpu_nodes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"
    run = tmp_path / "runs" / "70b"
    assert main(["launch", "--slurm", str(recipe), f"output.dir={run}", "train.learning_rate=1e-5",
                 "--partition", "gpu", "--time", "48:00:00", "--sbatch-option=--constraint=h100"]) == 0
    out = capsys.readouterr().out
    script = run / "slurm.sbatch"
    assert f"sbatch script written to {script}" in out and run.is_dir()  # the log directory exists before sbatch
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --partition=gpu", "#SBATCH --time=48:00:00", "#SBATCH --constraint=h100",
                     f"#SBATCH --output={run}/slurm-%j.out", "export MASTER_PORT=29500"):
        assert expected in lines, expected
    assert any(line.startswith("export MASTER_ADDR=") and "scontrol show hostnames" in line for line in lines)
    srun = shlex.split(next(line for line in lines if line.startswith("srun ")).removesuffix(" &"))
    assert srun[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert srun[2:] == ["recipeforge", "train", str(recipe), f"output.dir={run}", "train.learning_rate=1e-5",
                        f"output.dir={run}"]


def test_sbatch_script_for_cpu_processes(tmp_path, capsys):
    recipe = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    out = tmp_path / "job.sbatch"
    assert main(["launch", "--slurm", str(recipe), f"output.dir={tmp_path / 'run'}", "train.micro_batch_size=auto",
                 "--nproc-per-node", "2", "-o", str(out)]) == 0
    text = out.read_text()
    assert "--gpus-per-node" not in text and "#SBATCH --nodes=1" in text
    assert "--nproc-per-node 2 &\n" in text


def test_sbatch_script_states_the_recipes_restarts_and_rendezvous(tmp_path, capsys, monkeypatch):
    """The keys reach every node through the recipe; the header says what they are, the endpoint as
    it resolves (an ${env:MASTER_ADDR,...} endpoint resolves on each node to the exported address)."""
    from recipeforge.backends import elastic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MASTER_ADDR", "node001")
    recipe = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"
    run = tmp_path / "runs" / "70b"
    overrides = ["distributed.max_restarts=2", "distributed.rdzv_backend=c10d",
                 "distributed.rdzv_endpoint=${env:MASTER_ADDR,localhost}:29400"]
    assert main(["launch", "--slurm", str(recipe), f"output.dir={run}", *overrides]) == 0
    capsys.readouterr()
    lines = (run / "slurm.sbatch").read_text().splitlines()
    assert any(line.startswith("# Elastic restarts:") and "up to 2 time(s)" in line for line in lines)
    rdzv_id = elastic.rdzv_id(SimpleNamespace(rdzv_id=None), run)
    assert f"# Rendezvous: c10d at node001:29400 (as resolved when this script was written), id {rdzv_id}" in lines
    srun = shlex.split(next(line for line in lines if line.startswith("srun ")).removesuffix(" &"))
    assert all(o in srun for o in overrides)  # every node resolves the same recipe


def test_sbatch_script_of_a_static_recipe_has_no_elastic_header(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    assert main(["launch", "--slurm", str(ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"),
                 f"output.dir={run}"]) == 0
    text = (run / "slurm.sbatch").read_text()
    assert "# Elastic restarts" not in text and "# Rendezvous" not in text
