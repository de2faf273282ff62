"""Before a run writes anything: can its output location be written, and is it a place of its own?

`check_output_location` refuses (exit 2) an `output.dir` that is a file or lies below one, that cannot
be created or written (read-only file system, no permission, a pseudo file system such as /proc), whose
name is too long, that is the file system root, the home directory, the working directory or the
recipe's folder (or an ancestor of either), that lies inside a local dataset (or holds one), or that
`--overwrite` would wipe although it holds no run. It warns when the disk has less room than the
run's checkpoints and final model need.

`write_failure` turns an error raised while the run is being written (an `OSError` such as ENOSPC or
EROFS, or torch's and safetensors' wrappers of one) into a `RecipeError` that says what failed, what
is left (the last complete checkpoint) and what to do; `reports_write_errors` applies it to a function.
Pure Python: importable from the light command-line paths.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

from recipeforge.errors import RecipeError

WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EEXIST, errno.EDQUOT, errno.ENOTDIR,
                errno.EISDIR, errno.ENAMETOOLONG}
KEY = "output.dir"
# Bytes per parameter of one checkpoint's optimizer state (fp32 states; 8-bit optimizers 1 byte each).
OPTIMIZER_BYTES = {"adamw": 8, "adamw_fused": 8, "paged_adamw_32bit": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2,
                   "lion_8bit": 1, "adafactor": 1, "sgd": 0}
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
RUN_FILES = ("resolved_recipe.yaml", "plan.json", "metrics.jsonl", "checkpoints", "final", "environment.json",
             ".recipeforge.lock")  # the run lock (outputs.run_lock.LOCK_NAME) marks a run too


def _hint(code: int | None, where: Path) -> str:
    """What to do about a failed write, by its cause."""
    if code in (errno.ENOSPC, errno.EDQUOT):
        return (f"free space on the disk holding {where} ({_free(where)} free now) or set output.dir to a disk with "
                f"room; rerunning the same command continues from the last complete checkpoint")
    if code == errno.EROFS:
        return f"{where} is on a read-only file system: set output.dir to a writable location"
    if code in (errno.EACCES, errno.EPERM):
        return f"this user may not write {where}: set output.dir to a folder you own, or fix its permissions"
    if code in (errno.EEXIST, errno.ENOTDIR):
        return "a file stands where a folder is needed: remove it or set output.dir to another path"
    if code == errno.EISDIR:
        return "a folder stands where a file is written: remove it or set output.dir to another path"
    if code == errno.ENAMETOOLONG:
        return "set output.dir to a shorter path"
    return "check the disk and the permissions of output.dir, or set output.dir to another location"


def size(n: float) -> str:
    """``1.52 GB``, ``340 MB``, ``12 KB``: sizes for people."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit != "MB" else f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} KB"


def _reason(code: int | None) -> str:
    return os.strerror(code).lower() if code else "the write failed"


def _free(path: Path) -> str:
    existing = _nearest_existing(path)
    try:
        return size(shutil.disk_usage(existing).free)
    except OSError:
        return "unknown"


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


# -------------------------------------------------------------------------------------- before the run

def check_output_location(root: Path, *, recipe_path: Path | None = None,
                          datasets: Iterable[tuple[str, Path]] = (), overwrite: bool = False,
                          planned: "Planned | None" = None, log: Callable[[str], None] | None = None) -> None:
    """Refuse an output location the run cannot or must not write (see the module docstring); warn
    through `log` when the disk is short of the `planned` bytes. `datasets`: (key, resolved local path)."""
    target = Path(os.path.realpath(Path(root).expanduser().absolute()))
    shown = str(root)
    _refuse_shared_places(target, shown, recipe_path)
    _refuse_dataset_overlap(target, shown, datasets)
    _check_names(target, shown)
    existing = _nearest_existing(target)
    if existing == target and not target.is_dir():
        raise RecipeError(f"'{shown}' is an existing file, not a folder", key=KEY, hint=_hint(errno.EEXIST, target))
    if existing != target and not existing.is_dir():
        raise RecipeError(f"'{shown}' cannot be created: {existing} is a file, not a folder", key=KEY,
                          hint=_hint(errno.ENOTDIR, existing))
    _probe_writable(target, existing, shown)
    if overwrite and existing == target:
        _refuse_foreign_wipe(target, shown)
    if planned is not None and log is not None:
        free = _disk_free(existing)
        if free is not None and free < planned.total:
            log(f"warning: output.dir {shown}: {size(free)} free on its disk, and this run may write about "
                f"{size(planned.total)} ({planned.describe()}); free space or choose another output.dir "
                f"before the disk fills")


def _refuse_shared_places(target: Path, shown: str, recipe_path: Path | None) -> None:
    hint = "set output.dir to a folder of its own for this run, e.g. runs/<name> (--overwrite deletes it entirely)"
    home = Path(os.path.realpath(Path.home()))
    cwd = Path(os.path.realpath(Path.cwd()))
    what = None
    if target.parent == target:
        what = "the file system root"
    elif target == home:
        what = "the home directory"
    elif cwd == target or cwd.is_relative_to(target):
        what = "the working directory" if cwd == target else f"a parent of the working directory ({cwd})"
    elif recipe_path is not None and Path(os.path.realpath(recipe_path)) not in (
            target / "resolved_recipe.yaml", target / "recipe.lock.yaml"):
        # (A run's own resolved_recipe.yaml or recipe.lock.yaml continues that run: its folder is the run directory.)
        folder = Path(os.path.realpath(Path(recipe_path).absolute().parent))
        if folder == target or folder.is_relative_to(target):
            what = "the recipe's folder" if folder == target else f"a parent of the recipe's folder ({folder})"
    if what:
        raise RecipeError(f"'{shown}' is {what}: a run directory must be a folder of its own", key=KEY,
                          hint=hint)


def _refuse_dataset_overlap(target: Path, shown: str, datasets: Iterable[tuple[str, Path]]) -> None:
    for key, path in datasets:
        path = Path(os.path.realpath(path))
        if path.is_dir() and (target == path or target.is_relative_to(path)):
            raise RecipeError(f"'{shown}' is inside the dataset directory {path} ({key}.path): the run's "
                              f"files would be read as data", key=KEY,
                              hint="set output.dir to a folder outside the dataset, e.g. runs/<name>")
        if path.is_relative_to(target):
            raise RecipeError(f"the dataset {path} ({key}.path) is inside output.dir '{shown}': the run's files would "
                              f"mix with the data, and --overwrite would delete it", key=KEY,
                              hint="set output.dir to a folder that holds no data, e.g. runs/<name>")


def _check_names(target: Path, shown: str) -> None:
    existing = _nearest_existing(target)
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    # Files inside the run directory add to its path (checkpoints/.staging/checkpoint-<step>/...).
    long = next((part for part in target.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise RecipeError(f"'{shown}': the name '{long[:40]}...' is {len(os.fsencode(long))} bytes long, "
                          f"the file system allows {name_max}", key=KEY, hint=_hint(errno.ENAMETOOLONG, target))
    if len(os.fsencode(str(target))) + 128 > path_max:
        raise RecipeError(f"'{shown}' is {len(os.fsencode(str(target)))} bytes long; with the run's own "
                          f"files below it, paths would pass the file system's limit of {path_max}", key=KEY,
                          hint=_hint(errno.ENAMETOOLONG, target))


def _probe_writable(target: Path, existing: Path, shown: str) -> None:
    """Create (and remove) a probe where the run will write: the only test that sees read-only mounts,
    permissions (including root's limits) and pseudo file systems alike."""
    try:
        if existing == target:
            fd, probe = tempfile.mkstemp(prefix=".recipeforge-probe-", dir=target)
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".recipeforge-probe-", dir=existing))
    except OSError as exc:
        code = exc.errno if exc.errno in WRITE_ERRNOS else None
        where = target if existing == target else existing
        verb = "cannot be written" if existing == target else f"cannot be created in {existing}"
        raise RecipeError(f"'{shown}' {verb}: {exc.strerror or exc}", key=KEY,
                          hint=_hint(code, where)) from None


def _refuse_foreign_wipe(target: Path, shown: str) -> None:
    # The rule `export --overwrite` follows too: only a folder recipeforge wrote (its marker, or a run of
    # a version before the marker) is deleted; names alone (a folder of the user's called final/) are not enough.
    from recipeforge.outputs.ownership import is_owned

    entries = sorted(p.name for p in target.iterdir())
    if entries and not is_owned(target):
        raise RecipeError(f"'{shown}' holds {len(entries)} entries that are not a recipeforge run (e.g. "
                          f"'{entries[0]}'), and --overwrite would delete them", key=KEY,
                          hint="set output.dir to a new folder, or empty this one yourself")


def _disk_free(path: Path) -> float | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class Planned:
    """What a run is about to write, from the plan's parameter counts (an estimate, for a warning)."""

    def __init__(self, checkpoint: float, checkpoints: int, final: float, limit: int | None):
        self.checkpoint, self.checkpoints, self.final, self.limit = checkpoint, checkpoints, final, limit

    @property
    def total(self) -> float:
        return self.checkpoint * self.checkpoints + self.final

    def describe(self) -> str:
        kept = (f"output.save_total_limit {self.limit} plus one being saved" if self.limit
                else "at least two: output.save_total_limit is unset")
        return f"{self.checkpoints} checkpoints of {size(self.checkpoint)}: {kept}; final model {size(self.final)}"


def planned_output(plan, recipe) -> Planned | None:
    """The sizes a run's checkpoints and final model will have (None without parameter counts)."""
    extra = getattr(plan, "extra", None)
    model = (extra.model if extra is not None else None) or {}
    params = model.get("params")
    if not params:
        return None
    trainable = model.get("trainable_params") or params
    weight = DTYPE_BYTES.get(extra.dtype, 2)
    adapter = recipe.adapter.type != "none"
    weights = trainable * 4 if adapter else params * weight
    optimizer = trainable * OPTIMIZER_BYTES.get(recipe.train.optimizer, 8)
    if plan.traits.checkpoints_master_weights:
        optimizer += trainable * 4  # fp32 master weights travel with the engine's optimizer state
    final = weights + (params * weight if adapter and recipe.output.merge_adapter else 0)
    limit = recipe.output.save_total_limit
    return Planned(weights + optimizer, (limit + 1) if limit else 2, final, limit)


# -------------------------------------------------------------------------------------- while writing

_OS_ERROR = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")
_STRERROR = re.compile(r"strerror: ([^\n]+)")
_TORCH_WRITE = ("unexpected pos", "file write failed", "basic_ios::clear")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def failed_write(exc: BaseException) -> tuple[bool, int | None, str | None]:
    """(whether `exc` is a failed write, its errno if known, the file if known), following the chain of
    causes: an OSError, a Rust I/O error ("(os error 28)"), or torch's stream writer errors."""
    for e in _chain(exc):
        if isinstance(e, RecipeError):
            return False, None, None
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return True, e.errno, e.filename if isinstance(e.filename, str) else None
        text = str(e)
        m = _OS_ERROR.search(text)
        if m and int(m.group(1) or m.group(2)) in WRITE_ERRNOS:
            path = re.search(r'at path "([^"]+)"', text)
            return True, int(m.group(1) or m.group(2)), path.group(1) if path else None
        m = _STRERROR.search(text)
        if m:
            code = next((c for c in WRITE_ERRNOS if os.strerror(c) == m.group(1).strip()), None)
            if code is not None:
                return True, code, None
        if "inline_container" in text or "PytorchStreamWriter" in text:
            if any(marker in text for marker in _TORCH_WRITE):
                return True, None, None
    return False, None, None


def write_failure(exc: BaseException, run_root: Path | None = None) -> RecipeError | None:
    """A `RecipeError` for `exc` when it is a failed write (see `failed_write`), else None."""
    is_write, code, filename = failed_write(exc)
    if not is_write:
        return None
    root = Path(run_root) if run_root is not None else None
    if code is None and root is not None:
        # torch does not say why its write failed; a full disk is by far the most common cause.
        free = _disk_free(_nearest_existing(root))
        code = errno.ENOSPC if free is not None and free < 64 * 2**20 else None
    where = Path(filename) if filename else root
    if where is None:  # neither the file nor the folder is known: name no disk rather than a wrong one
        return RecipeError(f"a write failed: {_reason(code)}",
                           hint="free space on the disk of the output you asked for, or check its permissions")
    if root is not None and filename and Path(filename).absolute().is_relative_to(root.absolute()):
        inside = Path(filename).absolute().relative_to(root.absolute())
        what = f"writing the run directory {root} failed: {_reason(code)} ({inside})"
    elif root is not None and not filename:
        what = f"writing the run directory {root} failed: {_reason(code)}"
    else:
        what = f"cannot write {filename}: {_reason(code)}"
    if root is not None:
        what += f"; {_left_behind(root)}"
    return RecipeError(what, key=KEY if root is not None else None, hint=_hint(code, where or Path.cwd()))


def output_write_failure(exc: BaseException, out: Path, *, what: str, key: str = "--output") -> RecipeError | None:
    """A `RecipeError` for `exc` when it is a failed write while a command wrote the folder `out` (an
    export, a merged model), naming `out`, its disk and what to free; None for other errors. The folder
    is written beside `out` and replaces it only when complete, so nothing was replaced."""
    is_write, code, filename = failed_write(exc)
    if not is_write:
        return None
    out = Path(out).absolute()
    disk = _nearest_existing(out.parent)
    if code is None:  # torch does not say why; a full disk is by far the most common cause
        free = _disk_free(disk)
        code = errno.ENOSPC if free is not None and free < 64 * 2**20 else None
    message = f"writing {what} {out} failed: {_reason(code)}"
    if filename:
        message += f" ({filename})"
    message += f"; nothing was replaced ({out} is as it was)"
    if code in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free space on the disk holding {disk} ({_free(disk)} free now), or write it to another disk with -o DIR"
    elif code == errno.EROFS:
        hint = f"{disk} is on a read-only file system: write it elsewhere with -o DIR"
    elif code in (errno.EACCES, errno.EPERM):
        hint = f"this user may not write in {disk}: write it to a folder you own with -o DIR"
    else:
        hint = "check the disk and the permissions of the output folder, or write it elsewhere with -o DIR"
    return RecipeError(message, key=key, hint=hint)


def _left_behind(root: Path) -> str:
    from recipeforge.outputs.checkpoint import newest_complete

    last = newest_complete(root / "checkpoints")
    kept = (f"the last complete checkpoint is intact (checkpoints/{last.name})" if last is not None
            else "no complete checkpoint was written")
    return kept + ("" if (root / "final").is_dir() else ", final/ was not written")


def reports_write_errors(func: F) -> F:
    """Decorate a function that writes a run (it takes the `RunDir`): failed writes become `write_failure`s."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            root = next((getattr(a, "root") for a in (*args, *kwargs.values())
                         if type(a).__name__ == "RunDir" and hasattr(a, "root")), None)
            failure = write_failure(exc, root)
            if failure is None:
                raise
            raise failure from None
    return wrapper  # type: ignore[return-value]  # the same signature as `func`
