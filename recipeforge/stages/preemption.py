"""Stopping a run on request: SIGTERM, SIGUSR1, SIGHUP or Ctrl-C save a checkpoint and exit with code 75.

Schedulers preempt with SIGTERM (Slurm, Kubernetes, cloud spot instances), and Slurm can send a signal
ahead of the time limit (``--signal=B:USR1@120``). Every training process installs a handler that only
sets a flag, so the hot path costs one flag check per optimizer step; with several processes the flag
is all-reduced once per optimizer step (one int, MAX), so every rank decides to stop at the same step
and DDP/DeepSpeed collectives never wait for a rank that left. At that step the trainer saves a
checkpoint through the usual crash-safe path (staged, manifest, marker, published), then the run stops
without writing final/ and exits with `EXIT_PREEMPTED` (75, EX_TEMPFAIL: "try again"). Running the same
command again resumes from that checkpoint. SIGHUP is what a launched worker gets when the command that
launched it dies (`backends.parent_death`), and what a run gets when its terminal closes.

A signal before the first step stops at once (nothing new to save); one during or after the last step
lets the run finish normally. Ctrl-C: the first one stops like SIGTERM, a second one aborts without
saving (the newest published checkpoint is kept; crash safety covers the rest).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypedDict, Union

if TYPE_CHECKING:
    import torch
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

EXIT_PREEMPTED = 75                 # EX_TEMPFAIL (sysexits.h): stopped early, re-run to continue
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP")

# What `signal.getsignal` returns: a handler, SIG_DFL / SIG_IGN, or None (set outside Python).
_Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]


class _State(TypedDict):
    signal: int                      # the signal that asked this process to stop, 0 for none
    previous: dict[int, _Handler]     # signal -> the handler `install` replaced


_state: _State = {"signal": 0, "previous": {}}


class Preempted(Exception):
    """Training stopped on a signal after saving a checkpoint (or before its first step)."""

    def __init__(self, signal_name: str, step: int | None, checkpoint: Path | None):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.step is None:
            saved = (f"nothing new to save before the first step; the newest checkpoint is {self.checkpoint}"
                     if self.checkpoint else "nothing to save before the first step")
        elif self.checkpoint is not None:
            saved = f"checkpoint saved at step {self.step}: {self.checkpoint}"
        else:
            saved = f"stopped at step {self.step}, but no complete checkpoint of that step was found"
        return f"stopped by {self.signal_name}; {saved}"

    def to_dict(self) -> dict[str, Any]:
        return {"signal": self.signal_name, "step": self.step,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Preempted":
        ckpt = raw.get("checkpoint")
        return cls(raw.get("signal") or "a signal", raw.get("step"), Path(ckpt) if ckpt else None)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT and _state["signal"]:
        # A second Ctrl-C: abort now, without saving.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt
    if not _state["signal"]:
        _state["signal"] = signum
        # os.write, not print: a handler may run while the main thread is inside a print to stderr.
        msg = (f"[recipeforge] {_name(signum)} received: finishing the current step, then saving a checkpoint"
               + (" (Ctrl-C again aborts without saving)" if signum == signal.SIGINT else "") + "\n")
        try:
            os.write(2, msg.encode())
        except OSError:
            pass


def request(signum: int) -> None:
    """Ask this process to stop as the signal `signum` would (for a stop that arrives other than as a
    signal: a Ray worker's training runs off the main thread, and its stop comes from the launching
    command through a file, `backends.ray_worker`)."""
    if not _state["signal"]:
        _handler(signal.SIGTERM if signum == signal.SIGINT else signum, None)


def install() -> None:
    """Install the stop handlers in this process (main thread only; idempotent)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for name in STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        current = signal.getsignal(sig)
        if current is not _handler:
            _state["previous"][sig] = current
            signal.signal(sig, _handler)


def uninstall() -> None:
    """Put the previous handlers back and forget any request (in-process callers, tests)."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig, previous in _state["previous"].items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    _state["previous"].clear()
    _state["signal"] = 0


def requested() -> int:
    """The signal number that asked this process to stop, or 0."""
    return _state["signal"]


def agreed_stop(device: torch.device | None = None) -> int:
    """The stop request every rank agrees on (the largest signal number any rank received, 0 for none).
    One all-reduce of one int across the job when several processes train; a flag read otherwise."""
    local = _state["signal"]
    try:
        import torch.distributed as dist
    except ImportError:
        return local
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return local
    import torch

    flag = torch.tensor([local], dtype=torch.int32, device=collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def collective_device() -> torch.device:
    """The device a tensor must be on for a collective of the default process group: this process's
    GPU under NCCL (which has no CPU transport), else the CPU. Never a model parameter's device, which
    a sharded or placeholder-loaded model may hold anywhere."""
    import torch
    import torch.distributed as dist

    if "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_callback(checkpoints: Path, resumed_from: Path | None) -> TrainerCallback:
    """The TrainerCallback that stops training at the agreed step and has that step saved."""
    from transformers import TrainerCallback

    class StopOnSignal(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here (`Any`)
        """Checks the stop flag at every optimizer step's end (all ranks together)."""

        def __init__(self) -> None:
            self.stopped_at: int | None = None
            self.signum = 0

        def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> None:
            signum = agreed_stop()
            if signum:  # asked to stop while loading: nothing new to save
                raise Preempted(_name(signum), None, resumed_from)

        def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> None:
            if state.max_steps and state.global_step >= state.max_steps:
                return  # the last step: finishing costs less than a checkpoint and a restart
            signum = agreed_stop()
            if signum:
                self.signum, self.stopped_at = signum, state.global_step
                control.should_save = True
                control.should_log = True
                control.should_training_stop = True

        def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                         **kwargs: Any) -> None:
            if self.stopped_at is not None:  # already saved at the stop step; no epoch-end eval/save
                control.should_save = False
                control.should_evaluate = False

        def preempted(self) -> Preempted | None:
            if self.stopped_at is None:
                return None
            from recipeforge.outputs.checkpoint import PREFIX, is_complete

            ckpt = checkpoints / f"{PREFIX}{self.stopped_at}"
            return Preempted(_name(self.signum), self.stopped_at, ckpt if is_complete(ckpt) else None)

    return StopOnSignal()


def raise_if_stopped(trainer: Trainer) -> None:
    """After `trainer.train()` returned: raise `Preempted` if it stopped on a signal."""
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
        stop = cb.preempted() if hasattr(cb, "preempted") else None
        if stop is not None:
            raise stop
