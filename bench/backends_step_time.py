"""Time per optimizer step of the tiny SFT recipe on each backend, launched the way users launch it.

Each backend trains the same recipe (same global batch) through `recipeforge train`; the figure is the
trainer's own `train_runtime` / steps from metrics.jsonl (process start-up, data and model loading are
not in it), next to the whole command's wall time. On a CPU the processes use gloo; on GPUs drop
`--cpu-processes` and the plan uses every GPU.

    python bench/backends_step_time.py                       # single, ddp, zero2, zero3 on 2 CPU processes
    python bench/backends_step_time.py --steps 40 --backends ddp zero3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
BACKENDS = {"single": [], "ddp": ["distributed.backend=ddp"],
            "zero2": ["distributed.backend=deepspeed", "distributed.zero_stage=2"],
            "zero3": ["distributed.backend=deepspeed", "distributed.zero_stage=3"]}


def run(name: str, steps: int, processes: int, workdir: Path) -> dict:
    out = workdir / name
    cmd = [sys.executable, "-m", "recipeforge", "train", str(RECIPE), f"output.dir={out}", f"train.max_steps={steps}",
           "train.micro_batch_size=auto", "data.val_size=0", "output.save_steps=100000", "logging.progress_bar=false",
           f"data.cache_dir={workdir / 'cache'}", *BACKENDS[name], "--overwrite"]
    if name != "single" and processes:
        cmd += ["--nproc-per-node", str(processes)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = next(r for r in records if r.get("split") == "summary")
    return {"backend": name, "step_ms": 1000 * summary["train_runtime"] / steps, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu-processes", type=int, default=2, help="processes per node on a CPU (0: GPUs)")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(name, args.steps, args.cpu_processes, Path(tmp)) for name in args.backends]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'backend':<8} {'ms/step':>9} {'wall s':>8}   ({args.steps} steps of global batch 8, tiny Llama)")
    for r in rows:
        print(f"{r['backend']:<8} {r['step_ms']:>9.1f} {r['wall_s']:>8.1f}")


if __name__ == "__main__":
    main()
