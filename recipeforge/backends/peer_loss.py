"""A worker whose peer is gone: the communication error it gets is no bug of its own.

When one worker of a job dies (killed, crashed, out of host memory), every other worker's next
collective fails with the transport's error ("Connection closed by peer" from gloo, "remote process
exited" from NCCL). Reported as an internal error asking for a bug report, it would hide the real
cause, which the launcher reports for the worker that died. `lost_peer_message` recognises the case.
"""

from __future__ import annotations

import os

# What torch's transports say when the process at the other end is gone (gloo, TCPStore, NCCL).
LOST_PEER = ("Connection closed by peer", "Connection reset by peer", "Gloo connectFullMesh failed",
             "remote process exited", "Broken pipe")


def in_launched_job() -> bool:
    """Whether this process is one worker of several (started by torchrun or accelerate launch)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def lost_peer_message(exc: BaseException) -> str | None:
    """The message for `exc` when it is a worker's lost connection to another worker, else None."""
    text = str(exc)
    if not in_launched_job() or not any(pattern in text for pattern in LOST_PEER):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    restarts = "; the launcher restarts the worker group (distributed.max_restarts)" if restarts_left() else ""
    return (f"worker {os.environ.get('RANK', '?')} lost its connection to another worker of the job, which is gone "
            f"(the launcher's report below says which one and why){restarts}: {first[:300]}")


def restarts_left() -> int:
    """How many more times the elastic agent will restart this worker group."""
    def number(name: str) -> int:
        raw = os.environ.get(name, "0")
        return int(raw) if raw.isdecimal() else 0

    return max(0, number("TORCHELASTIC_MAX_RESTARTS") - number("TORCHELASTIC_RESTART_COUNT"))
