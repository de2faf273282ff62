"""Processes of a launched job end when the process that started them ends, however it ends.

Linux delivers a chosen signal to a process when its parent dies (``prctl(PR_SET_PDEATHSIG)``). The
launching `recipeforge train` sets it on the launcher it starts (SIGHUP: torch's elastic agent, which
accelerate and torchrun run, answers it by stopping its workers with SIGTERM and waiting for them),
and every worker sets it on itself (SIGTERM: the preemption handler saves a checkpoint at the next
step boundary and exits), so a SIGKILLed `recipeforge train` leaves no worker behind holding GPU memory
or the run directory. Elsewhere (macOS, Windows) this is a no-op.
"""

from __future__ import annotations

import os
import sys

PR_SET_PDEATHSIG = 1


def end_with_parent(sig: int) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; if the parent is already
    gone (this process was re-parented before asking), send it now. Returns whether it is armed."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent == 1 or os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), sig)
    return True
