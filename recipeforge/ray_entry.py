"""The process entry points of a Ray launch (`distributed.launcher: ray`, `recipeforge launch --ray`), beside
`__main__`: the driver ``python -m recipeforge.ray_entry RUN/ray_job.json`` that the launching command
starts (`backends.ray_driver.run_job`), and `train_loop`, the function each Ray Train worker runs: the
launch's setup (`backends.ray_worker.start_worker`), then the worker entry torchrun's workers run
(`run.worker.main` on the launch's worker spec), in the Ray worker's process.
"""

from __future__ import annotations

import sys
from pathlib import Path


class WorkerExit(RuntimeError):
    """The worker entry ended with a non-zero exit code in a Ray worker (Ray counts it as a failure)."""


def train_loop(config: dict) -> None:
    """One Ray Train worker: the worker entry on the launch's worker spec."""
    from recipeforge.backends.ray_worker import start_worker
    from recipeforge.run.worker import main

    rank, done = start_worker(config)
    try:
        code = main(list(config["argv"]))
    finally:
        done.set()
    if code != 0:
        raise WorkerExit(f"rank {rank}: the worker on {' '.join(config['argv'])} exited with code {code}")


def main(argv: list[str] | None = None) -> int:
    """The driver: submit RUN/ray_job.json to the Ray cluster and wait; its exit code."""
    from recipeforge.backends.ray_driver import run_job

    argv = sys.argv[1:] if argv is None else argv
    return run_job(Path(argv[0]), train_loop)


if __name__ == "__main__":
    raise SystemExit(main())
