"""Inside a Ray Train worker of a `launcher: ray` launch: what `ray_entry.train_loop` does before it runs the
worker entry point.

Ray has set the variables torchrun would (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and joined the process group (`TorchConfig`: gloo or NCCL) before this runs, so the worker's
own `init_process_group` finds it joined. `start_worker` adds the launch's environment (accelerate's
settings), numbers the attempt (rank 0 counts the group's starts in the run directory
and tells the others; a restarted group resumes like an elastic restart, `run.restarts`), changes to the
launching command's working directory (relative recipe and data paths mean the same) and watches for the
driver's stop request; then `ray_entry.train_loop` runs the worker entry torchrun's workers run
(`run.worker.main` on the worker spec), and raises a non-zero exit, so Ray counts the failure (and
restarts the group if allowed).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

STOP_POLL_S = 0.5
# The attempt number torch's elastic agent gives its workers (0, then 1, 2 ... per restart), which
# `run.restarts` and the test faults read: a Ray worker group's start sets the same.
ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"


def next_attempt(attempts_dir: Path) -> int:
    """Rank 0 of a starting worker group: this start's number (0: the first), left as a marker."""
    attempts_dir.mkdir(parents=True, exist_ok=True)
    attempt = len([p for p in attempts_dir.iterdir() if p.name.startswith("attempt-")])
    (attempts_dir / f"attempt-{attempt}").write_text(f"{os.getpid()}\n")
    return attempt


def watch_stop(stop_path: Path, done: threading.Event) -> None:
    """Turn the driver's stop request into the stop a signal asks for (training runs off the main thread
    here, where no signal handler can be installed)."""
    from recipeforge.stages import preemption

    while not done.wait(STOP_POLL_S):
        if stop_path.exists():
            try:
                signum = int(stop_path.read_text().strip() or 15)
            except (OSError, ValueError):
                signum = 15
            preemption.request(signum)
            return


def start_worker(config: dict[str, Any]) -> tuple[int, threading.Event]:
    """Everything before the worker entry point runs: the launch's environment, the attempt's number
    (agreed through rank 0), the working directory, the GPU, the stop watcher. Returns this worker's
    rank and the event that ends the watcher."""
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    os.environ.update(config["env"])
    rank = ray.train.get_context().get_world_rank()
    attempt = broadcast_from_rank_zero(next_attempt(Path(config["attempts_dir"])) if rank == 0 else None)
    os.environ[ATTEMPT_ENV] = str(attempt)
    if Path(config["cwd"]).is_dir():
        os.chdir(config["cwd"])
    if config.get("use_gpu"):
        import torch
        from ray.train.torch import get_device

        torch.cuda.set_device(get_device())
    done = threading.Event()
    threading.Thread(target=watch_stop, args=(Path(config["stop_path"]), done), daemon=True,
                     name="recipeforge-stop-watch").start()
    return rank, done
