"""transformers' native expert parallel on CPU gloo processes, against one process: the engine that
`distributed.expert_parallel` plans for (`transformers.distributed.DistributedConfig(ep_size=N,
fsdp_size=N)`, all-to-all token dispatch), run on the built-in `tiny:qwen3_moe` (8 experts, 2 per
token). Each rank trains on its share of one fixed batch; the script prints how many experts each rank
holds (the local shard of the fused expert weights, read from the model) and every rank's loss per
step next to the one-process loss on the whole batch, whose mean they should equal.

    python bench/expert_parallel_gloo.py                  # 2 processes, 5 SGD steps
    python bench/expert_parallel_gloo.py --processes 4 --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BATCH, SEQ, VOCAB = 8, 16, 256


def build(path: Path) -> None:
    """Save the tiny Qwen3-MoE (random init, seed 0, a 256-token vocabulary) to `path`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from recipeforge.components.tiny_spec import TINY_CONFIGS

    fields = {k: v for k, v in TINY_CONFIGS["qwen3_moe"].items() if k != "model_type"}
    fields["vocab_size"] = VOCAB
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **fields)).save_pretrained(path)


def train(path: Path, steps: int) -> dict:
    """One process of the comparison (under torchrun when WORLD_SIZE > 1): SGD steps on this rank's
    rows of the batch; returns the experts it holds per layer and its losses."""
    import torch
    from transformers import AutoModelForCausalLM

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    kwargs = {}
    if world > 1:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(ep_size=world, fsdp_size=world)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    held = []
    for layer in model.model.layers:
        weight = layer.mlp.experts.gate_up_proj
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        held.append(int(local.shape[0]))
    torch.manual_seed(1)
    batch = torch.randint(0, VOCAB, (BATCH, SEQ))
    rows = batch.chunk(world)[rank]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=rows, labels=rows).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        value = loss.detach()
        losses.append(float(value.full_tensor() if hasattr(value, "full_tensor") else value))
    return {"rank": rank, "experts_held": held, "losses": losses}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: the model folder, run one process
    args = parser.parse_args(argv)
    if args.worker:
        # one file per rank: the ranks' stdout lines interleave under torchrun
        result = train(Path(args.worker), args.steps)
        (Path(args.worker).parent / f"result-{result['rank']}-{os.environ.get('WORLD_SIZE', '1')}.json").write_text(
            json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny-moe"
        build(path)
        me = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--steps", str(args.steps)]
        single = _results(subprocess.run(me, capture_output=True, text=True), Path(tmp), 1)
        multi = _results(subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                         str(args.processes), *me[1:]], capture_output=True, text=True),
                         Path(tmp), args.processes)
    one = single[0]["losses"]
    print(f"1 process: experts held per layer {single[0]['experts_held']}")
    for r in sorted(multi, key=lambda r: r["rank"]):
        print(f"rank {r['rank']} of {args.processes} (gloo, expert parallel {args.processes}): experts held per layer "
              f"{r['experts_held']}")
    print("step  one process  " + "  ".join(f"rank {r['rank']:<6}" for r in multi) + "  mean of ranks  |diff|")
    for step, loss in enumerate(one):
        ranks = [r["losses"][step] for r in sorted(multi, key=lambda r: r["rank"])]
        mean = sum(ranks) / len(ranks)
        print(f"{step + 1:>4}  {loss:11.5f}  " + "  ".join(f"{x:11.5f}" for x in ranks)
              + f"  {mean:13.5f}  {abs(mean - loss):.1e}")


def _results(proc: subprocess.CompletedProcess, folder: Path, world: int) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(folder.glob(f"result-*-{world}.json"))]
    if proc.returncode != 0 or not found:
        raise SystemExit(f"a run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return found


if __name__ == "__main__":
    main()
