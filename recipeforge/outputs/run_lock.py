"""One run per run directory: an exclusive advisory lock, held for the run's whole life.

`recipeforge train` locks ``RUN_DIR/.recipeforge.lock`` (``fcntl.flock``) before it touches anything
in the run directory, and writes who holds it into the file (pid, host, start time, command). A
second `train` into the same directory is refused with exit code 2 naming that holder. The launching
process holds the lock and hands it to the launcher it starts (an inherited descriptor), so the lock
stays held while any launched process lives; workers never lock (their parent already does).

The kernel drops an flock when its last holder dies, so a run killed with SIGKILL leaves no lock
behind: the next run takes it over and says whose it was. The file is removed on a clean exit.
Filesystems without flock (some Lustre/NFS mounts) fall back to the holder record alone: a holder on
this host whose pid is gone is taken over; one on another host is refused (delete the file by hand).

`exclusive(path)` is the same lock for other shared files, blocking: the tokenized-data cache builds
each entry under it, so two processes never build the same entry at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recipeforge.components.file_lock import UNSUPPORTED, exclusive  # noqa: F401 - re-exported
from recipeforge.errors import RecipeError

LOCK_NAME = ".recipeforge.lock"
# flock not offered by this filesystem: fall back to the holder record.
_UNSUPPORTED = UNSUPPORTED


@dataclass
class RunLock:
    """A held run-directory lock (the open, flocked lock file)."""

    path: Path
    fd: int
    ident: tuple[int, int]     # (device, inode) of the file this process locked
    flock: bool = True

    def still_ours(self) -> bool:
        """Whether the lock file at `path` is still the one this process locked."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def release(self) -> None:
        """Remove the lock file (only if it is still ours) and drop the lock."""
        if self.fd < 0:
            return
        if self.still_ours():
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self.fd)  # closing the last descriptor of this process drops the flock
        self.fd = -1


_held: dict[Path, RunLock] = {}


def holder_info() -> dict:
    """Who this process is, as written into the lock file."""
    # The command without its overrides: those may carry values that must not land in a file.
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(["recipeforge", *sys.argv[1:3]])[:500]}
    launch = _elastic_launch()
    if launch is not None:  # a worker of torch's elastic agent (``torchrun -m recipeforge train``)
        info["launch"], info["attempt"] = launch
    return info


def _elastic_launch() -> tuple[str, int] | None:
    """(run id, attempt) of the elastic launch this process is a worker of, if any."""
    run_id, attempt = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return (run_id, int(attempt) if attempt.isdecimal() else 0) if run_id else None


def _earlier_attempt(info: dict) -> bool:
    """Whether `info` is the holder record of an earlier attempt of this process's elastic launch: the
    agent ended every worker of that attempt before restarting, so the holder is gone even where it
    cannot be checked (another host, a filesystem without flock). A new launch is never one."""
    launch = _elastic_launch()
    return (launch is not None and info.get("launch") == launch[0]
            and isinstance(info.get("attempt"), int) and info["attempt"] < launch[1])


def acquire(run_root: Path, *, log: Callable[[str], None] | None = None) -> RunLock:
    """Lock `run_root` for this process (creating the directory), or raise a `RecipeError` naming the
    run that holds it. Re-entrant within one process."""
    root = Path(run_root).absolute()
    if root in _held and _held[root].fd >= 0:
        return _held[root]
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    for _ in range(20):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        use_flock = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            previous = _read(fd)
            if previous is None:  # its holder locked it a moment ago and is writing its details
                time.sleep(0.3)
                previous = _read(fd)
            os.close(fd)
            raise _busy(root, path, previous) from None
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                os.close(fd)
                raise
            use_flock = False
        st = os.fstat(fd)
        try:
            now = os.stat(path)
        except FileNotFoundError:  # its holder released (and removed) it meanwhile: start again
            os.close(fd)
            continue
        if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
            os.close(fd)
            continue
        break
    else:
        raise RecipeError(f"cannot lock run directory {root}: its lock file keeps changing", key="output.dir")
    previous = _read(fd)
    earlier = bool(previous) and _earlier_attempt(previous)
    if previous and not use_flock and not earlier and _alive_elsewhere(previous):
        os.close(fd)
        raise _busy(root, path, previous)
    if earlier and log is not None:
        log(f"restart {_elastic_launch()[1]} of launch {previous.get('launch')}: taking over the lock of run "
            f"directory {root} from its attempt {previous.get('attempt')} (pid {previous.get('pid')} on "
            f"{previous.get('host')})")
    elif previous and previous.get("pid") != os.getpid() and log is not None:
        log(f"taking over the lock of run directory {root} from pid {previous.get('pid')} on "
            f"{previous.get('host')} (since {previous.get('since')}), which ended without releasing it")
    _write(fd, holder_info())
    lock = RunLock(path, fd, (st.st_dev, st.st_ino), use_flock)
    _held[root] = lock
    return lock


def held(run_root: Path) -> RunLock | None:
    """This process's lock on `run_root`, if it holds one."""
    lock = _held.get(Path(run_root).absolute())
    return lock if lock is not None and lock.fd >= 0 else None


def reassert(run_root: Path, *, log: Callable[[str], None] | None = None) -> None:
    """After the run directory was wiped (``--overwrite``), lock the new lock file again; if another
    run took the directory meanwhile, this one stops (exactly one of them goes on)."""
    lock = held(run_root)
    if lock is None or lock.still_ours():
        return
    os.close(lock.fd)
    lock.fd = -1
    del _held[Path(run_root).absolute()]
    acquire(run_root, log=log)


def release_all() -> None:
    """Release every run lock this process holds (end of `train`)."""
    for root in list(_held):
        _held.pop(root).release()


def _read(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        data = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(fd: int, info: dict) -> None:
    data = (json.dumps(info) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


def _alive_elsewhere(info: dict) -> bool:
    """Without flock: whether the recorded holder may still run (another host: assume it does)."""
    if info.get("host") != socket.gethostname():
        return True
    return info.get("pid") != os.getpid() and _pid_alive(info.get("pid"))


def _busy(root: Path, path: Path, info: dict | None) -> RecipeError:
    if info:
        who = f"pid {info.get('pid')} on host {info.get('host')}, since {info.get('since')}"
        if info.get("host") == socket.gethostname() and not _pid_alive(info.get("pid")):
            who += " (that process has exited; processes it started still hold the lock)"
        if info.get("command"):
            who += f": {info['command']}"
    else:
        who = "another process (it has not written its details yet)"
    return RecipeError(f"run directory {root} is in use by another run: {who}", key="output.dir",
                       hint=f"wait for that run to finish or stop it, or set output.dir to another directory; "
                            f"if you are sure no such run is alive, delete {path}")
