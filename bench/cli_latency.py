"""Median wall time of the CLI's light commands on examples/yaml/qlora-70b.yaml.

    python bench/cli_latency.py [--runs 7]

Targets: `validate` under 0.5 s and `plan` under 0.6 s median on a 2-core machine. Each command
runs in a fresh process, as a user would run it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "examples/yaml/qlora-70b.yaml"
COMMANDS = {
    "--help": ["--help"],
    "validate": ["validate", RECIPE],
    "resolve": ["resolve", RECIPE],
    "plan": ["plan", RECIPE, "--hardware", "1xH100-80GB"],
}
TARGETS = {"validate": 0.5, "plan": 0.6}


def time_command(prefix: list[str], args: list[str], runs: int) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(prefix + args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
        code = code or proc.returncode
    return statistics.median(times), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = shutil.which("recipeforge")
    prefix = [exe] if exe else [sys.executable, "-m", "recipeforge"]
    print(f"{'command':<10} {'median s':>9}  target  (runs={args.runs}, {' '.join(prefix)})")
    failed = False
    for name, cmd in COMMANDS.items():
        median, code = time_command(prefix, cmd, args.runs)
        target = TARGETS.get(name)
        verdict = "" if target is None else ("ok" if median < target else "SLOW")
        status = "" if code == 0 else f"  (exit {code})"
        print(f"{name:<10} {median:>9.3f}  {'' if target is None else f'< {target}'} {verdict}{status}")
        failed |= verdict == "SLOW"
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
