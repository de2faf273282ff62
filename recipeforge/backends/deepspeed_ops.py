"""DeepSpeed's just-in-time extensions: built once, one process at a time, never waited on for ever.

DeepSpeed compiles its CPU Adam (optimizer offload) and, on a CPU, its shared-memory collectives the first
time a process asks for them: about a minute each on two cores, cached in the folder recipeforge gives it
(``~/.cache/recipeforge/torch_extensions``, or ``$TORCH_EXTENSIONS_DIR``). torch guards each build with a
``lock`` file that holds no process id: a build stopped half-way (Ctrl-C in a first run's minute of
compiling, a killed job) leaves it behind, and every later run waits on it for ever, with no word.

So every recipeforge process that may build (each rank of a DeepSpeed run, in its worker setup) builds
here first, under an operating-system lock on the folder (``flock``: released by the kernel when its
holder dies, however it dies). Holding it, no other recipeforge build can be running, so a torch ``lock``
found in recipeforge's own cache is one a stopped build left: it is removed, and said so. A folder given by
``$TORCH_EXTENSIONS_DIR`` is the user's, and other programs may build in it: a lock there is named while
DeepSpeed waits on it, and one older than half an hour stops the run (exit 2) with the command that removes
it; recipeforge deletes nothing there.

Building ahead of a run (an image, a node's first boot, CI) takes the first run's minute away::

    python -m recipeforge.backends.deepspeed_ops

Exits 2 with a hint when DeepSpeed is not installed.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CPU_ADAM = "CPUAdamBuilder"  # optimizer offload, on every accelerator
SHM_COMM = "ShareMemCommBuilder"  # the shared-memory all-reduce of CPU runs
GUARD = ".recipeforge-build.lock"
# In a folder of the user's, a lock this old is a stopped build's: no extension DeepSpeed builds takes half
# an hour. Younger, another program's build may be under way.
FOREIGN_STALE_S = 1800


def needed(*, on_cpu: bool, offload_optimizer: bool) -> tuple[str, ...]:
    """The extensions a DeepSpeed run loads: CPU Adam when it offloads optimizer states, the shared-memory
    all-reduce when it runs on CPUs."""
    return ((CPU_ADAM,) if offload_optimizer else ()) + ((SHM_COMM,) if on_cpu else ())


def extensions_dir() -> str:
    """Where recipeforge has DeepSpeed cache its JIT-built extensions (built once per machine, not per run)."""
    from recipeforge.components.lm_data import default_cache_root

    return str(default_cache_root() / "torch_extensions")


def extensions_folder() -> tuple[Path, bool]:
    """Where DeepSpeed builds (set in the environment for it), and whether it is recipeforge's own cache."""
    own = extensions_dir()
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TORCH_EXTENSIONS_DIR"] = given or own
    return Path(given or own), given in (None, "", own)


@contextmanager
def build_guard(folder: Path) -> Iterator[None]:
    """Hold the folder's build lock (waiting for another recipeforge build to end or die)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / GUARD, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clear_stale_lock(build_dir: Path, *, own_folder: bool, log: Callable[[str], None]) -> bool:
    """Remove torch's build ``lock`` in ``build_dir`` when a stopped build left it (see the module); with
    the build guard held. Returns whether one was removed."""
    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if own_folder:
        lock.unlink(missing_ok=True)
        log(f"DeepSpeed: removed {lock}, left by a build that stopped half-way ({age:.0f}s ago); building again")
        return True
    if age > FOREIGN_STALE_S:  # not recipeforge's folder: its files are the user's to delete
        from recipeforge.errors import RecipeError

        raise RecipeError(f"DeepSpeed's build lock {lock} is {age / 60:.0f} minutes old: a build that stopped "
                          f"half-way left it, and DeepSpeed would wait on it for ever",
                          key="TORCH_EXTENSIONS_DIR",
                          hint=f"if no build is running, delete it (rm {lock}) and run again")
    log(f"DeepSpeed: waiting on {lock} (another build's, {age:.0f}s old); if no build is running, delete it")
    return False


def ensure_built(names: tuple[str, ...], log: Callable[[str], None] = print) -> list[tuple[str, float]]:
    """Build (or find built) the named extensions, under the folder's build lock; return each one's name and
    the seconds it took. DeepSpeed later loads them from its cache of loaded extensions."""
    if not names:
        return []
    folder, own = extensions_folder()
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    built = []
    with build_guard(folder):
        for name in names:
            builder = accelerator.create_op_builder(name)
            if builder is None or not builder.is_compatible():
                continue
            clear_stale_lock(folder / builder.name, own_folder=own, log=log)
            start = time.perf_counter()
            builder.load()
            built.append((builder.name, time.perf_counter() - start))
    return built


def main() -> int:
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        print("error: DeepSpeed is not installed\nhint: pip install 'recipeforge[deepspeed]'", file=sys.stderr)
        return 2
    on_cpu = get_accelerator().device_name() == "cpu"
    for name, seconds in ensure_built(needed(on_cpu=on_cpu, offload_optimizer=True)):
        print(f"{name}: ready in {seconds:.1f}s ({os.environ['TORCH_EXTENSIONS_DIR']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
