"""Tensor parallel on two CPU processes over gloo, through the fsdp backend's loader: the plan's
DistributedConfig (transformers' tensor-parallel plan) shards the tiny Llama's weights as DTensors on
the ``tp`` mesh, and training them follows the one-process loss curve step by step, ending in the same
weights once gathered.

On a plain MULTI_CPU state Accelerate refuses the Trainer's ParallelismConfig
(accelerate/parallelism_config.py, `_validate_accelerator`: "only compatible DistributedType.FSDP
(version 2) or DistributedType.Multi{Device} or DistributedType.DEEPSPEED"); the worker records that
message, so this test notices when Accelerate starts accepting it. The fsdp backend names its CPU
workers' state MULTI_GPU, and test_fsdp_cpu.py trains tensor parallel through the Trainer that way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.backends.tensor_parallel_worker import STEPS, train_losses

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def _plan(tmp: Path):
    """The planner's plan for a 2-GPU target with tensor_parallel pinned to 2 (the layout the backend runs)."""
    from recipeforge.config.pipeline import load_recipe
    from recipeforge.plan.hardware import parse_hardware
    from recipeforge.plan.plan import make_plan

    recipe = tmp / "tp.yaml"
    recipe.write_text(f"extends: {REPO / 'examples/yaml/tiny/sft-full.yaml'}\n"
                      "distributed: {backend: fsdp, tensor_parallel: 2}\n"
                      "hardware: {nodes: 1, gpus_per_node: 2, gpu: H100-80GB}\n")
    loaded = load_recipe(str(recipe), [])
    return make_plan(loaded.recipe, parse_hardware("1x2xH100-80GB"))


def _reference(model_dir: Path) -> tuple[list[float], dict]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return train_losses(model), model.state_dict()


def test_tensor_parallel_two_cpu_processes_match_one(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from recipeforge.components.models import tiny_config

    plan = _plan(tmp_path)
    assert (plan.backend, plan.tensor_parallel, plan.data_parallel, plan.world_size) == ("fsdp", 2, 1, 2)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict(), default=str))

    class _Tok:  # the special token ids tiny_config copies into the config
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    AutoModelForCausalLM.from_config(tiny_config("llama", _Tok())).save_pretrained(model_dir)

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "tensor_parallel_worker.py"), str(tmp_path / "plan.json"), str(model_dir), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-6000:]
    got = json.loads((tmp_path / "rank0.json").read_text())

    assert (got["world"], got["backend"], got["tp_size"]) == (2, "gloo", 2)
    # every projection of the tensor-parallel plan is a DTensor sharded on the 2-rank tp mesh
    proj = [n for n in got["sharded"] if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                     "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                                                     "down_proj.weight"))]
    assert len(proj) == 2 * 7
    for name in proj:
        info = got["sharded"][name]
        assert info["mesh"] == ["tp"] and info["mesh_size"] == 2 and info["shard"], (name, info)
        assert info["local"] != info["full"] and sum(info["local"]) < sum(info["full"]), (name, info)
    assert any("Shard(dim=0)" in got["sharded"][n]["placements"] for n in proj)   # column-wise
    assert any("Shard(dim=1)" in got["sharded"][n]["placements"] for n in proj)   # row-wise

    ref_losses, ref_state = _reference(model_dir)
    assert len(got["losses"]) == STEPS
    assert got["losses"][-1] < got["losses"][0]  # it learned the fixed batches
    for step, (a, b) in enumerate(zip(got["losses"], ref_losses)):
        assert abs(a - b) < 1e-4, (step, got["losses"], ref_losses)

    full = torch.load(tmp_path / "full_state.pt")
    for name, ref in ref_state.items():
        if name in full:
            assert torch.allclose(full[name], ref, atol=1e-4), name
    assert {n for n in ref_state if "proj" in n} <= set(full)

    # What stops the Trainer path on the CPU, recorded from Accelerate itself.
    assert got["accelerate_error"] and "MULTI_CPU" in got["accelerate_error"], got["accelerate_error"]
