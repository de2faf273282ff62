"""Which folders recipeforge may delete: the ones it wrote, recognised by its own marker file.

Every folder a command creates to hold its output (a run directory, an export, a merged model) gets
`OWNER_FILE`, a small JSON record of what wrote it. Replacing a folder (`train --overwrite`, `export
--overwrite`, `merge -o` into a folder merged before) goes through `check_replaceable` and
`remove_owned`, which refuse:

- the file system root, the home directory, the working directory and any folder holding it, and the
  places the caller names (the run being exported and the folders holding it), whatever they contain;
- a folder that holds anything without the marker (nor, for runs written before the marker existed,
  a resolved_recipe.yaml recipeforge headed with its hash, or an export.json recipeforge wrote).

Staging folders (`staged_folder`) are named after the process that made them, removed on every exit
Python sees (an error, Ctrl-C, SIGTERM turned into an exception by `stop_on_sigterm`), and those a
killed process left behind are removed by the next command that stages beside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator

from recipeforge.errors import RecipeError

OWNER_FILE = ".recipeforge-owned"
STAGING_PREFIX = ".recipeforge-staging-"
# Files recipeforge keeps in a run directory while it is being made: a folder holding only these is its own.
BOOKKEEPING = (".recipeforge.lock", OWNER_FILE)


def mark_owned(folder: Path, kind: str, foreign: Iterable[str] = ()) -> None:
    """Record in `folder` that recipeforge wrote it (`kind`: run, export, merged). `foreign`: entries
    that were there before (a run pointed at a folder of the user's): while any of them is left, the
    folder is not recipeforge's to delete."""
    from recipeforge import __version__

    folder = Path(folder)
    record = {"written_by": "recipeforge", "kind": kind, "version": __version__,
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "foreign": sorted(foreign)}
    tmp = folder / f".{OWNER_FILE}.tmp"
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, folder / OWNER_FILE)


def is_owned(folder: Path) -> bool:
    """Whether recipeforge wrote `folder`: its marker, or (runs and exports of versions before the marker)
    a resolved_recipe.yaml with recipeforge's hash header, or an export.json recipeforge wrote; a folder
    holding only recipeforge's bookkeeping files (a run lock) counts too."""
    folder = Path(folder)
    marker = folder / OWNER_FILE
    if marker.exists():
        try:
            record = json.loads(marker.read_text())
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict) or record.get("written_by") != "recipeforge":
            return False
        foreign = record.get("foreign") or []
        return not any(isinstance(name, str) and os.path.lexists(folder / name) for name in foreign)
    from recipeforge.outputs.run_guard import HASH_HEADER

    try:
        head = (folder / "resolved_recipe.yaml").read_text(errors="replace")[:4096]
        if any(line.startswith(HASH_HEADER) for line in head.splitlines()[:3]):
            return True
    except OSError:
        pass
    try:
        record = json.loads((folder / "export.json").read_text())
        if isinstance(record, dict) and "recipeforge" in record and "format" in record:
            return True
    except (OSError, ValueError):
        pass
    try:
        return all(entry.name in BOOKKEEPING for entry in folder.iterdir())
    except OSError:
        return False


def protected_reason(folder: Path, also: Iterable[tuple[Path, str]] = ()) -> str | None:
    """Why `folder` may never be replaced (None when it may): the root, the home directory, the working
    directory or a folder holding it, or one of `also` ((path, what) pairs: the folder itself or any
    folder holding it)."""
    target = Path(os.path.realpath(Path(folder).expanduser().absolute()))
    if target.parent == target:
        return "the file system root"
    if target == Path(os.path.realpath(Path.home())):
        return "the home directory"
    cwd = Path(os.path.realpath(Path.cwd()))
    if cwd == target:
        return "the working directory"
    if cwd.is_relative_to(target):
        return f"a parent of the working directory ({cwd})"
    for path, what in also:
        real = Path(os.path.realpath(Path(path).expanduser().absolute()))
        if real == target:
            return what
        if real.is_relative_to(target):
            return f"a parent of {what} ({real})"
    return None


def check_replaceable(folder: Path, *, overwrite: bool, key: str, also: Iterable[tuple[Path, str]] = (),
                      flag: str = "--overwrite") -> None:
    """Refuse (a `RecipeError` at `key`) to write a folder of output at `folder`: a protected place
    (`protected_reason`), a file, a folder with files without `overwrite`, or with `overwrite` a folder
    recipeforge did not write (`is_owned`)."""
    folder = Path(folder)
    why = protected_reason(folder, also)
    if why:
        raise RecipeError(f"{folder} is {why}: recipeforge never writes over it", key=key,
                          hint="choose a folder of its own for the output, e.g. -o exports/my-model")
    if folder.exists() and not folder.is_dir():
        raise RecipeError(f"{folder} exists and is not a folder", key=key, hint="choose another path")
    entries = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if not entries:
        return
    if not overwrite:
        raise RecipeError(f"{folder} already holds files", key=key,
                          hint=f"pass {flag} to replace them, or choose another folder")
    if not is_owned(folder):
        raise RecipeError(f"{folder} holds {len(entries)} entries recipeforge did not write (e.g. '{entries[0]}'; "
                          f"no {OWNER_FILE} marker), and {flag} would delete them", key=key,
                          hint="choose a new folder, or empty this one yourself")


def remove_owned(folder: Path, *, also: Iterable[tuple[Path, str]] = ()) -> None:
    """Delete `folder` after the checks of `check_replaceable` (the one place recipeforge deletes a folder
    of output as a whole); a `RecipeError` when they fail."""
    folder = Path(folder)
    if not folder.exists():
        return
    check_replaceable(folder, overwrite=True, key="--overwrite", also=also)
    shutil.rmtree(folder)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale_staging(parent: Path) -> None:
    """Remove staging folders in `parent` whose process is gone (killed by SIGKILL, a power cut)."""
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(STAGING_PREFIX) or not entry.is_dir():
            continue
        pid = entry.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdecimal() and not _pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def staging_folder(parent: Path, purpose: str) -> Path:
    """A new staging folder in `parent` named after this process (`sweep_stale_staging` finds it)."""
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_staging(parent)
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-{purpose}-", dir=parent))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process stands (`stop_on_sigterm`) so its cleanups run."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM (a `kill`, a scheduler's stop) raises `KeyboardInterrupt` in the main
    thread (`Terminated`, a KeyboardInterrupt), so `finally` blocks remove staging and temporary folders before the process
    ends; the handler before is put back afterwards. Outside the main thread, nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated("SIGTERM")

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
