"""The Ray driver of a `launcher: ray` launch (``python -m recipeforge.ray_entry RUN/ray_job.json`` runs
`run_job` with the worker function of `recipeforge.ray_entry`).

`run_launcher` starts it as it starts torchrun: in the foreground, holding the run directory's lock,
stop signals ignored until this module installs its own. It connects to the Ray cluster, submits
Ray Train's `TorchTrainer` (one worker per planned process, `ray_entry.train_loop` in each)
and waits. Exit code: 0 when the workers finished (or stopped on request: the outcome file says which),
1 when the worker group failed more often than `max_failures` allows, 2 when Ray is missing or the
cluster cannot be reached. A stop signal (SIGTERM, SIGUSR1, Ctrl-C, SIGHUP when the launching command
died) becomes a stop request next to the worker spec, which every worker reads; the driver keeps waiting
for them to save and stop.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from recipeforge.backends.ray_launch import INSTALL_HINT, RayJob, describe

if TYPE_CHECKING:
    from types import FrameType

# What accelerate's launcher sets for the process layout and the rendezvous (Ray sets these itself), and
# the launching machine's module path (DeepSpeed's launch adds its working directory; a node has its own).
LAYOUT_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
              "GROUP_RANK", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")


def log(message: str) -> None:
    print(f"[recipeforge] {message}", file=sys.stderr, flush=True)


def accelerate_env(argv: list[str]) -> dict[str, str]:
    """The environment `accelerate launch ARGV` gives its workers (mixed precision, FSDP and DeepSpeed
    settings from the config file), computed by accelerate's own launcher functions, less the process
    layout Ray sets. Empty for a launch without accelerate (torchrun's workers get no extra variables)."""
    if not argv:
        return {}
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args, defaults, mp_from_config_flag = _validate_launch_command(launch_command_parser().parse_args(argv))
    if args.use_deepspeed and not args.cpu:
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if mp_from_config_flag else []))
        _, env = prepare_deepspeed_cmd_env(args)
    elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return {k: str(v) for k, v in env.items()
            if os.environ.get(k) != str(v) and k not in LAYOUT_ENV and not k.startswith(("PET_", "TORCHELASTIC_"))}


def worker_env(job: RayJob) -> dict[str, str]:
    """Everything the Ray workers get on top of their node's environment."""
    forwarded = {k: v for k, v in os.environ.items() if k.startswith(tuple(job.forward_prefixes))}
    return {**forwarded, **accelerate_env(job.accelerate_argv), **job.worker_env}


def request_stop_on_signals(job: RayJob) -> None:
    """Stop signals leave a stop request for the workers (the first one's name); the driver goes on
    waiting for them to save and stop. A second Ctrl-C reaches us as SIGKILL from the launching command."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not job.stop_path.exists():
            job.stop_path.write_text(f"{signum}\n")
            log(f"{signal.Signals(signum).name}: asking the Ray workers to save a checkpoint and stop")

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)


CONNECT_TIMEOUT_S = 10.0
RAY_CLIENT_PORT = 10001


def unreachable(address: str) -> str | None:
    """Why the cluster at `address` cannot be reached (None: it answers, or `auto`, which Ray looks up
    itself). `ray.init` waits minutes on a head that does not answer; a TCP connect says so in seconds."""
    import socket

    if address == "auto":
        try:  # the cluster `ray start` left its address for on this machine (Ray's own lookup)
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address("auto") or ""
        except Exception:  # noqa: BLE001 - a private helper: without it, ray.init looks up and says
            return None
        if not address:
            return None  # none started here: ray.init says so at once
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, colon, port_text = target.rpartition(":")
    host, port = (host, int(port_text)) if colon else (target, RAY_CLIENT_PORT)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"nothing answers at {host}:{port} ({exc})"


def run_job(job_path: Path, train_loop: Callable[[dict[str, Any]], None]) -> int:
    """Submit the job at `job_path` with `train_loop` as each worker's function, wait; the exit code."""
    job = RayJob.read(Path(job_path))
    job.stop_path.unlink(missing_ok=True)  # an earlier launch's
    if job.attempts_dir.is_dir():
        for marker in job.attempts_dir.iterdir():
            marker.unlink()
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError as exc:
        print(f"error: Ray Train is not installed ({exc})\n  hint: {INSTALL_HINT}", file=sys.stderr)
        return 2
    env = worker_env(job)
    try:
        why = unreachable(job.address)
        if why is not None:
            raise ConnectionError(why)
        ray.init(address=job.address, log_to_driver=True, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(f"error: cannot connect to the Ray cluster at {job.address}: {exc}\n  hint: start one (`ray start "
              "--head`), or give its address (distributed.ray_address, RAY_ADDRESS, --ray-address)", file=sys.stderr)
        return 2
    request_stop_on_signals(job)
    log(describe(job))
    config = {"argv": job.worker_argv, "env": env, "cwd": job.cwd, "stop_path": str(job.stop_path),
              "attempts_dir": str(job.attempts_dir), "use_gpu": job.use_gpu}
    trainer = TorchTrainer(
        train_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu,
                                     resources_per_worker=dict(job.resources_per_worker)),
        torch_config=TorchConfig(backend=job.torch_backend, timeout_s=job.timeout_s),
        run_config=RunConfig(name=job.name, storage_path=job.storage_path,
                             failure_config=FailureConfig(max_failures=job.max_failures)))
    try:
        trainer.fit()
    except Exception as exc:  # noqa: BLE001 - Ray's TrainingFailedError (and its kin): the workers failed
        log(f"the Ray workers failed ({type(exc).__name__}): {exc}")
        return 1
    finally:
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - the job's result stands
            pass
    return 0
