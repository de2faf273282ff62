"""One rank of the two-process tensor-parallel run (started by torchrun from test_tensor_parallel_cpu.py).

Loads the model through the fsdp backend's tensor-parallel loader (`backends.parallelism`, the one
`FSDPBackend.setup_worker` installs: transformers' DistributedConfig with the model's tp_plan), checks
that the weights are DTensors sharded on the ``tp`` mesh, trains a few AdamW steps on fixed batches, and
gathers the full weights the way the backend's `save_final` does. It also records what Accelerate says
when the Trainer is given the plan's ParallelismConfig on the CPU.

    torchrun --nproc_per_node 2 tensor_parallel_worker.py PLAN_JSON MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from recipeforge.backends import parallelism
from recipeforge.backends.fsdp_run import gathered_state_dict
from recipeforge.backends.worker import plan_from_dict

STEPS, BATCH, SEQ, LR = 5, 4, 32, 3e-3


def batches(vocab: int) -> list[torch.Tensor]:
    """The same token batches on every rank and in the one-process reference: two batches in turn,
    so a few steps measurably lower the loss."""
    g = torch.Generator().manual_seed(7)
    two = [torch.randint(0, vocab, (BATCH, SEQ), generator=g) for _ in range(2)]
    return [two[i % 2] for i in range(STEPS)]


def train_losses(model) -> list[float]:
    """A few AdamW steps on `batches`: the loss of each (the same loop in both runs)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    losses = []
    for ids in batches(model.config.vocab_size):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(plan_path: str, model_dir: str, out_dir: str) -> None:
    plan = plan_from_dict(json.loads(Path(plan_path).read_text()))
    model = parallelism.load_tensor_parallel(model_dir, plan, dtype=torch.float32, attn_implementation="sdpa")
    rank = dist.get_rank()
    from torch.distributed.tensor import DTensor, Shard

    sharded = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            sharded[name] = {"mesh": list(p.device_mesh.mesh_dim_names or ()), "mesh_size": p.device_mesh.size(),
                             "placements": [repr(x) for x in p.placements],
                             "local": list(p.to_local().shape), "full": list(p.shape),
                             "shard": any(isinstance(x, Shard) for x in p.placements)}
    losses = train_losses(model)
    full = gathered_state_dict(model)

    # The Trainer path: Accelerate validates a ParallelismConfig against its distributed state.
    trainer_error = None
    try:
        from accelerate import Accelerator

        Accelerator(cpu=True, parallelism_config=parallelism.parallelism_config(plan))
    except ValueError as exc:
        trainer_error = str(exc)
    if rank == 0:
        out = Path(out_dir)
        torch.save({k: v.clone() for k, v in full.items()}, out / "full_state.pt")
        (out / "rank0.json").write_text(json.dumps({
            "world": dist.get_world_size(), "backend": dist.get_backend(), "tp_size": model.tp_size,
            "losses": losses, "sharded": sharded, "params": len(list(model.parameters())),
            "accelerate_error": trainer_error}))
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:4])
