"""bench/gpu/common.py `run_bounded`: a GPU case that hangs costs its own time limit, not the lease. The
command and every process it started are stopped (a launcher's workers would keep the GPU), the output so far
is kept, and the case ends with exit 124 so the suite records it and starts the next one."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

# A launcher stand-in: it starts a worker that outlives it unless its whole group is stopped, says so on
# stderr, then waits for ever.
HANGING_LAUNCHER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"worker {worker.pid}", file=sys.stderr, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of a live parent stays a zombie until reaped; the stand-in's parent is gone too
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


def test_a_hanging_case_is_stopped_with_its_workers_and_reported():
    start = time.monotonic()
    proc = common.run_bounded([sys.executable, "-c", HANGING_LAUNCHER], timeout=3)
    assert time.monotonic() - start < 30
    assert proc.returncode == common.TIMED_OUT
    assert "stopped after 3 s" in proc.stderr
    worker = int(proc.stderr.split("worker ")[1].split()[0])  # what the command printed before it hung is kept
    for _ in range(50):
        if not _alive(worker):
            break
        time.sleep(0.1)
    assert not _alive(worker), "the launcher's worker outlived the case"


def test_a_case_that_ends_keeps_its_exit_status_and_output():
    proc = common.run_bounded([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=60)
    assert (proc.returncode, proc.stdout) == (3, "out\n")
