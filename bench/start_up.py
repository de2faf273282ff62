"""CPU time and wall time of a tiny training process with its start-up out of the garbage collector's way
(`recipeforge.start_up`) and without.

    python bench/start_up.py [--runs 3]

Both run the tiny SFT recipe (40 steps) in one process, as `recipeforge train` runs it. With: the command
as a user types it (`python -m recipeforge train ...`: the collector paused until the libraries are
imported, then their objects frozen). Without: the same `main` called with its arguments from a
program (`main(argv)`), which leaves the collector as Python set it. Printed: the median CPU time (user +
system, the process and its children) and wall time of each, and the difference.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
AS_TYPED = [sys.executable, "-m", "recipeforge"]
FROM_A_PROGRAM = [sys.executable, "-c", "import sys; from recipeforge.cli import main; raise SystemExit(main(sys.argv[1:]))"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(prefix: list[str], work: Path, *extra: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one tiny training run started with `prefix`."""
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    cpu, start = children_cpu(), time.perf_counter()
    subprocess.run([*prefix, "train", str(RECIPE), f"output.dir={run}", f"data.cache_dir={work / 'cache'}",
                    "logging.progress_bar=false", *extra], check=True, cwd=work, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return children_cpu() - cpu, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one_run(AS_TYPED, work)  # tokenized once, so every timed run reads the cache
        figures = {}
        for name, prefix in (("paused at start-up", AS_TYPED), ("collector as Python sets it", FROM_A_PROGRAM)):
            runs = [one_run(prefix, work) for _ in range(args.runs)]
            figures[name] = (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
    print(f"{'tiny SFT, one process':<30} {'CPU s':>7} {'wall s':>7}  (median of {args.runs})")
    for name, (cpu, wall) in figures.items():
        print(f"{name:<30} {cpu:>7.2f} {wall:>7.2f}")
    (cpu_on, wall_on), (cpu_off, wall_off) = figures.values()
    print(f"{'saved':<30} {cpu_off - cpu_on:>7.2f} {wall_off - wall_on:>7.2f}  "
          f"({100 * (cpu_off - cpu_on) / cpu_off:.0f}% of the CPU time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
