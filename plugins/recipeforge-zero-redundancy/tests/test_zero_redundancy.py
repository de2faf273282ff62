"""The zero_redundancy backend, installed as a plugin, through the commands a user types: recipeforge
lists it, `validate` checks a recipe against its capabilities, `plan` chooses it where DDP does not fit
and explains it with its memory terms, `train --dry-run` shows its launcher, and two gloo processes
train the tiny SFT recipe on the loss curve of one process, with optimizer states really sharded,
a consolidated optimizer.pt in every checkpoint and an exact resume from it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
LARGE = REPO / "examples" / "yaml" / "llama3-8b-full-sft.yaml"
# Six steps of global batch 8 over 16 packed sequences: whole batches only.
VARIANT = ("train.max_steps=6", "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=3",
           "data.val_size=0", "logging.progress_bar=false")


def recipeforge(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)
    if check:
        assert proc.returncode == 0, f"{args}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    return proc


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r.get("split") == "train" and "loss" in r]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zero-redundancy")


@pytest.fixture(scope="module")
def reference(workdir) -> Path:
    """One process, same recipe and global batch: the curve two sharded processes must reproduce."""
    run = workdir / "single"
    recipeforge("train", str(SFT), f"output.dir={run}", *VARIANT, cwd=workdir)
    return run


@pytest.fixture(scope="module")
def sharded(workdir) -> tuple[Path, subprocess.CompletedProcess]:
    run = workdir / "zero-redundancy"
    proc = recipeforge("train", str(SFT), f"output.dir={run}", *VARIANT, "distributed.backend=zero_redundancy",
                       "--nproc-per-node", "2", cwd=workdir)
    return run, proc


def test_the_backend_is_listed_as_a_loaded_plugin(tmp_path):
    out = recipeforge("plugins", cwd=tmp_path).stdout
    section = out[out.index("backends (recipeforge.backends)"):]
    assert "zero_redundancy" in section.splitlines()[2] and "recipeforge-zero-redundancy 0.1.0  loaded" in section


def test_validate_checks_a_recipe_against_its_capabilities(tmp_path):
    ok = recipeforge("validate", str(SFT), "distributed.backend=zero_redundancy", cwd=tmp_path)
    assert "valid" in ok.stdout.lower()
    refused = recipeforge("validate", str(SFT), "distributed.backend=zero_redundancy", "distributed.offload=optimizer",
                          cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "zero_redundancy backend cannot offload" in refused.stderr and "distributed.offload" in refused.stderr
    typo = recipeforge("validate", str(SFT), "distributed.backend=zero_redundancyy", cwd=tmp_path, check=False)
    assert typo.returncode == 2 and "did you mean 'zero_redundancy'" in typo.stderr


def test_plan_chooses_it_where_ddp_does_not_fit_and_explains_its_memory(tmp_path):
    args = (str(LARGE), "--hardware", "8xH100-80GB", "model.name_or_path=Qwen/Qwen3-4B", "data.sequence_len=4096")
    plan = json.loads(recipeforge("plan", *args, "--json", cwd=tmp_path).stdout)
    assert plan["backend"] == "zero_redundancy" and plan["world_size"] == 8
    assert "first layout in preference order that fits" in plan["reasons"]["backend"]["reason"]
    assert "optimizer states sharded over the ranks" in plan["reasons"]["preset"]["reason"]
    ddp = next(r for r in plan["extra"]["runners_up"] if r["backend"] == "ddp")
    assert not ddp["fits"] and ddp["memory_gb"] > plan["memory_gb"]["total"]
    # Its memory terms: DDP's fp32 weights, gradients and buckets; AdamW's two states over 8 ranks
    mem = plan["memory_gb"]
    assert mem["comm_buffers"] == mem["gradients"] == mem["weights"]
    assert mem["optimizer"] == pytest.approx(2 * mem["weights"] / 8, rel=0.02)
    table = recipeforge("plan", *args, cwd=tmp_path).stdout
    assert table.startswith("Plan: zero_redundancy on 8xH100-80GB")


def test_dry_run_shows_its_launcher(tmp_path):
    out = recipeforge("train", str(SFT), *VARIANT, "distributed.backend=zero_redundancy", "--nproc-per-node", "2",
                      "--dry-run", f"output.dir={tmp_path / 'run'}", cwd=tmp_path)
    text = out.stdout + out.stderr
    assert text.startswith("# plan: zero_redundancy, 1 node(s) x 2 CPU processes")
    assert "accelerate launch --config_file" in text and "num_processes: 2" in text
    assert not (tmp_path / "run" / "final").exists()


def test_two_processes_follow_the_one_process_curve(sharded, reference):
    run, proc = sharded
    assert "launching accelerate:" in proc.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["backend"], plan["world_size"], plan["data_parallel"]) == ("zero_redundancy", 2, 2)
    mine, ref = losses(run), losses(reference)
    assert len(mine) == len(ref) == 6, (mine, ref)
    assert mine == pytest.approx(ref, abs=1e-3), (mine, ref)
    assert mine[-1] < mine[0] - 0.5  # and it learns


def test_each_process_keeps_only_its_share_of_the_optimizer_states(sharded):
    run, _ = sharded
    seen = json.loads((run / "backend.json").read_text())["observed"]
    assert (seen["optimizer"], seen["inner_optimizer"], seen["process_group_backend"], seen["num_processes"]) == \
        ("ZeroRedundancyOptimizer", "AdamW", "gloo", 2)
    trained = seen["trained_param_elements"]
    assert 0 < seen["local_param_elements"] < trained  # this rank steps a part of the parameters
    assert seen["local_state_elements"] == 2 * seen["local_param_elements"]  # exp_avg + exp_avg_sq of its part


def test_checkpoints_hold_the_whole_optimizer_state_and_resume_exactly(sharded, workdir):
    import torch

    run, _ = sharded
    state = torch.load(run / "checkpoints" / "checkpoint-3" / "optimizer.pt", weights_only=False)
    seen = json.loads((run / "backend.json").read_text())["observed"]
    elements = sum(s["exp_avg"].numel() for s in state["state"].values())
    assert elements == seen["trained_param_elements"]  # consolidated from both ranks
    resumed = workdir / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "checkpoint-6")
    shutil.rmtree(resumed / "final")
    proc = recipeforge("train", str(SFT), f"output.dir={resumed}", *VARIANT, "distributed.backend=zero_redundancy",
                       "--nproc-per-node", "2", cwd=workdir)
    assert f"resuming from {resumed / 'checkpoints' / 'checkpoint-3'}" in proc.stderr
    assert losses(resumed) == pytest.approx(losses(run), abs=1e-5)
