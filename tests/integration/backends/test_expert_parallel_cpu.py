"""Expert parallel on two CPU processes over gloo, launched as `recipeforge train --nproc-per-node 2`
launches them (from the test's process): the tiny Qwen3-MoE (8 experts, 2 per token, both layers MoE)
with `distributed.expert_parallel: 2`. Each rank holds 4 of each layer's 8 experts (read from the model
inside the run, per rank), tokens go to their experts by all-to-all, FSDP2 shards the rest; the loss
curve is the one process's, each layer's expert load is in metrics.jsonl, and final/ is a plain
transformers checkpoint equal to the gathered weights of the last checkpoint.

The load-balancing loss is off for the curve comparison: the Trainer scales each process's loss by the
number of processes when it averages tokens across them (`average_tokens_across_devices`), which is
exact for the token loss but not for the auxiliary term added inside the model, so the logged loss of
any multi-process MoE run differs from one process's by about (processes - 1) x coefficient x aux loss
(the routers are frozen here: it moves no weight). The routers' gradients and everything else match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "moe-lora.yaml"
# Full fine-tuning of the tiny MoE; LoRA on the routed experts does not combine with expert parallel.
VARIANT = ("adapter.type=none", "output.merge_adapter=false", "moe.aux_loss=false", "train.learning_rate=1e-3",
           "train.max_steps=6", "train.micro_batch_size=auto", "train.logging_steps=1", "output.save_steps=3",
           "data.val_size=0")
EP = ("distributed.backend=fsdp", "distributed.expert_parallel=2")
TOL = 1e-4  # measured: 1e-6 on the loss and grad norm, per step


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("expert-parallel")


@pytest.fixture(scope="module")
def single(tiny, workdir) -> Path:
    """One process, same recipe and global batch: every expert on the one rank."""
    return tiny.train(str(RECIPE), workdir / "single", *VARIANT)


@pytest.fixture(scope="module")
def ep_run(tiny, workdir) -> Path:
    # Launched from this process (`Tiny.launch`): its tests read what the workers held, trained and wrote.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # in the launcher's and the workers' environment
        return tiny.launch(str(RECIPE), workdir / "ep2", *VARIANT, *EP)


def test_two_processes_follow_the_one_process_curve(tiny, ep_run, single):
    plan = json.loads((ep_run / "plan.json").read_text())
    assert (plan["backend"], plan["world_size"], plan["data_parallel"]) == ("fsdp", 2, 2)
    assert plan["reasons"]["expert_parallel"]["value"] == 2
    mine, ref = tiny.values(ep_run, "loss"), tiny.values(single, "loss")
    assert len(mine) == 6 and mine == pytest.approx(ref, abs=TOL), (mine, ref)
    assert tiny.values(ep_run, "grad_norm") == pytest.approx(tiny.values(single, "grad_norm"), abs=TOL)
    assert mine[-1] < mine[0] - 0.3  # it learned


def test_each_rank_holds_half_the_experts(ep_run):
    """Read from the model each rank trained (expert_parallel/rank<N>.json), not from the recipe."""
    for rank in (0, 1):
        held = json.loads((ep_run / "expert_parallel" / f"rank{rank}.json").read_text())
        assert (held["rank"], held["world_size"], held["process_group_backend"]) == (rank, 2, "gloo")
        assert [(layer["experts"], layer["of"]) for layer in held["layers"]] == [(4, 8), (4, 8)]
        assert held["expert_elements"] * 2 == held["expert_elements_full"] > 0
        assert held["other_elements"] < held["other_elements_full"]  # FSDP2 shards the rest
    seen = json.loads((ep_run / "backend.json").read_text())["observed"]
    assert (seen["device"], seen["num_processes"], seen["process_group_backend"]) == ("cpu", 2, "gloo")
    assert seen["expert_parallel"]["layers"][0]["experts"] == 4
    assert seen["dtensor_params"] == seen["params"]


def test_expert_load_is_in_the_metrics(tiny, ep_run):
    train_rows = [r for r in tiny.records(ep_run, "train") if "loss" in r]
    assert len(train_rows) == 6
    for record in train_rows:
        load = record["moe/expert_load"]
        # every expert of both layers counted by its global id (experts 4-7 live on the other rank)
        assert len(load) == 2 and all(len(layer) == 8 for layer in load)
        assert sum(load[0]) == sum(load[1]) > 0 and sum(load[0]) % 2 == 0
        assert any(count > 0 for count in load[0][4:])
        assert record["moe/load_imbalance"] >= 1.0


def test_final_is_a_plain_checkpoint_equal_to_the_gathered_weights(ep_run, single, tmp_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ep_run / "final", dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    mine = model.state_dict()
    # the sharded state of the last checkpoint (step 6), every rank's DCP shard put together
    dcp_to_torch_save(ep_run / "checkpoints" / "checkpoint-6" / "expert_parallel", tmp_path / "gathered.pt")
    gathered = torch.load(tmp_path / "gathered.pt", weights_only=True)["model"]
    assert set(gathered) == set(mine)
    for name, tensor in gathered.items():
        assert torch.equal(mine[name], tensor), name
    # the same layout one process writes (per-expert weights, as the hub's checkpoints)
    from safetensors.torch import load_file

    files = load_file(ep_run / "final" / "model.safetensors")
    assert set(files) == set(load_file(single / "final" / "model.safetensors"))
    ref = AutoModelForCausalLM.from_pretrained(single / "final", dtype=torch.float32).state_dict()
    assert max((mine[k] - ref[k]).abs().max().item() for k in ref) < 1e-4
