"""The experts of one MoE layer run three ways on this machine: transformers' `eager` loop (one pair
of matmuls per expert hit), `grouped_mm` (one grouped GEMM for all experts, torch `grouped_mm`) and
`batched_mm` (one batched matmul over every token-expert pair). Same weights, same routing; prints the
forward and forward+backward time of each, its speed-up over the loop and its largest difference
from the loop's output.

The layer is Qwen3-30B-A3B's (hidden 2048, expert width 768, 8 experts per token) with fewer experts
and tokens so that it fits a CPU:

    python bench/moe_experts.py                              # 16 experts, 512 tokens, fp32
    python bench/moe_experts.py --experts 128 --tokens 4096 --dtype bf16 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def build(args: argparse.Namespace):
    """The experts module of a Qwen3-MoE layer at the requested shape, and a routed batch."""
    import torch
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=args.hidden, moe_intermediate_size=args.width, num_experts=args.experts,
                            num_experts_per_tok=args.top_k)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    experts = Qwen3MoeExperts(config).to(args.device, dtype)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.02)
    hidden = torch.randn(args.tokens, args.hidden, device=args.device, dtype=dtype)
    logits = torch.randn(args.tokens, args.experts, device=args.device)
    weights, index = torch.topk(logits.softmax(-1), args.top_k, dim=-1)
    return config, experts, hidden, index, (weights / weights.sum(-1, keepdim=True)).to(dtype)


def timed(fn, repeats: int, device: str) -> float:
    """Median seconds of `fn` over `repeats` runs after one warm-up."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config, experts, hidden, index, weights = build(args)
    print(f"layer: {args.experts} experts of {args.hidden}x{args.width} (gate, up, down), top-{args.top_k}, "
          f"{args.tokens} tokens, {args.dtype} on {args.device} ({torch.get_num_threads()} threads), "
          f"torch {torch.__version__}")
    reference = None
    results = {}
    for impl in IMPLEMENTATIONS:
        config._experts_implementation = impl
        experts.config = config

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return experts(hidden, index, weights)

        def forward_backward() -> None:
            x = hidden.detach().requires_grad_(True)
            experts.zero_grad(set_to_none=True)
            experts(x, index, weights).float().square().mean().backward()

        try:
            out = forward()
            fwd = timed(forward, args.repeats, args.device)
            both = timed(forward_backward, args.repeats, args.device)
        except (RuntimeError, NotImplementedError) as exc:
            print(f"  {impl:<11} cannot run here: {str(exc).splitlines()[0][:120]}")
            continue
        reference = out if reference is None else reference
        diff = float((out.float() - reference.float()).abs().max())
        results[impl] = (fwd, both)
        base = results["eager"] if "eager" in results else (fwd, both)
        print(f"  {impl:<11} forward {fwd * 1e3:8.1f} ms ({base[0] / fwd:4.1f}x)   forward+backward "
              f"{both * 1e3:8.1f} ms ({base[1] / both:4.1f}x)   max |diff| vs eager {diff:.2e}")


if __name__ == "__main__":
    main()
