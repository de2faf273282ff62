"""Crash-safe checkpoints for any transformers/TRL trainer.

The trainer writes each checkpoint under ``checkpoints/.staging/checkpoint-<step>``; once every rank has
finished, rank 0 writes the completeness marker (atomically, fsynced) and publishes the directory with
one ``os.replace`` to ``checkpoints/checkpoint-<step>``. Before the marker, rank 0 writes the
checkpoint's manifest (every file's path, size and hash; see `manifest.py`), which a resume verifies.
A process killed at any point therefore leaves either a complete published checkpoint or a staging
leftover that is never resumed from. Rotation (`output.save_total_limit`) runs after publishing and
only ever counts complete checkpoints.

`RECIPEFORGE_FAULT=<point>:<step>` kills the process with SIGKILL at a named point, so crash safety can
be tested reproducibly: ``step`` (during training, after <step> optimizer steps), ``save-partial`` (inside
the save of <step>: weights written, optimizer not yet), ``save-staged`` (the whole checkpoint staged,
not yet published), ``save-published`` (published, rotation not yet run). ``oom`` raises PyTorch's
out-of-memory error at <step> instead, so the runtime answer to it can be tested without a GPU.
``kill:<rank>:<step>`` SIGKILLs only that rank after <step> optimizer steps, and only in the first
attempt of a launch (torch's elastic agent counts restarts in ``TORCHELASTIC_RESTART_COUNT``), so a
restarted worker group runs through: the test of elastic restarts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from functools import lru_cache
from pathlib import Path

from recipeforge.outputs.checkpoint import MARKER, PREFIX, checkpoints, is_complete
from recipeforge.outputs.manifest import MANIFEST, write_manifest

STAGING = ".staging"
from recipeforge.settings import FAULT_ENV, current  # noqa: E402


def _fault_point(raw: str | None = None) -> tuple[str, int] | None:
    raw = current().fault if raw is None else raw
    point, _, step = raw.partition(":")
    return (point, int(step)) if point and step.isdecimal() else None


def maybe_fault(point: str, step: int) -> None:
    """SIGKILL this process if `RECIPEFORGE_FAULT` names `point` at `step` (crash-safety tests)."""
    if _fault_point() == (point, step):
        os.kill(os.getpid(), signal.SIGKILL)


def rank_kill_step(raw: str) -> int | None:
    """The step at which `raw` (``RECIPEFORGE_FAULT``) as ``kill:<rank>:<step>`` kills this process:
    None unless this is that rank (``RANK``) in the first attempt of its launch (a restarted worker
    must not fail again)."""
    point, _, rest = raw.partition(":")
    rank, _, step = rest.partition(":")
    if point != "kill" or not (rank.isdecimal() and step.isdecimal()):
        return None
    if os.environ.get("RANK", "0") != rank or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return int(step)


def maybe_fail_oom(step: int) -> None:
    """Raise torch's out-of-memory error if `RECIPEFORGE_FAULT` is ``oom:<step>`` (tests of the OOM report)."""
    if _fault_point() == ("oom", step):
        import torch

        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (raised by {FAULT_ENV})")


def write_marker(directory: Path, step: int, *, manifest: str | None = None) -> None:
    """Write the completeness marker atomically: temp file, fsync, rename. `manifest` names the
    checkpoint's manifest file, so a checkpoint that lost it is recognised as damaged."""
    tmp = directory / (MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, **({"manifest": manifest} if manifest else {})}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / MARKER)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rotate(directory: Path, limit: int | None, keep: Path | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `limit`, never `keep` (the best one)."""
    if not limit:
        return []
    done = [p for p in checkpoints(directory) if is_complete(p)]
    keep = keep.resolve() if keep is not None else None
    removable = [p for p in done if p.resolve() != keep]
    excess = len(done) - limit
    removed = []
    for path in removable[:max(0, excess)]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class _CrashSafeCheckpoints:
    """The checkpoint hooks `crash_safe` puts in front of a trainer class (a mixin: `super()` is the trainer).

    A save goes to the staging directory; once every rank's files are on disk, rank 0 publishes it
    (`_publish`), and every rank waits for that before training goes on. Kept at module level rather
    than built inside `crash_safe`: the hooks are the same for every trainer class, only the base differs.
    """

    _rf_staging_root: str | None = None
    _rf_fault: tuple[str, int] | None = None  # RECIPEFORGE_FAULT, read once per train() call
    _rf_kill: int | None = None               # its kill:<rank>:<step> form, for this process

    def _get_output_dir(self, trial):
        # While `_save_checkpoint` runs, the Trainer's own save writes under the staging directory.
        return self._rf_staging_root or super()._get_output_dir(trial)

    def train(self, *args, **kwargs):
        raw = current().fault  # not per step: the step hook below is free when unset
        self._rf_fault, self._rf_kill = _fault_point(raw), (rank_kill_step(raw) if raw else None)
        return super().train(*args, **kwargs)

    def training_step(self, *args, **kwargs):
        if self._rf_fault is not None:
            maybe_fault("step", self.state.global_step)
            maybe_fail_oom(self.state.global_step)
        if self._rf_kill is not None and self._rf_kill == self.state.global_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().training_step(*args, **kwargs)

    def _save_optimizer_and_scheduler(self, output_dir):
        maybe_fault("save-partial", self.state.global_step)
        return super()._save_optimizer_and_scheduler(output_dir)

    def _save_checkpoint(self, model, trial):
        root = Path(super()._get_output_dir(trial))
        staging = root / STAGING
        name = f"{PREFIX}{self.state.global_step}"
        if self.args.should_save:
            shutil.rmtree(staging / name, ignore_errors=True)  # a leftover of a killed save
        self.accelerator.wait_for_everyone()
        self._rf_staging_root = str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._rf_staging_root = None
        self.accelerator.wait_for_everyone()  # every rank's shards are on disk
        if self.args.should_save:
            self._publish(root, staging / name, root / name)
        self.accelerator.wait_for_everyone()

    def _publish(self, root: Path, staged: Path, final: Path) -> None:
        step = self.state.global_step
        best = self.state.best_model_checkpoint
        if best and Path(best).parent.name == STAGING:  # the Trainer saw the staged path
            self.state.best_model_checkpoint = str(root / Path(best).name)
            self.state.save_to_json(str(staged / "trainer_state.json"))
        maybe_fault("save-staged", step)
        # Every rank's files are on disk: list them with sizes and hashes (verified on resume).
        write_manifest(staged, skip=(MARKER, MARKER + ".tmp"))
        write_marker(staged, step, manifest=MANIFEST)
        if final.exists():  # the same step saved again after a resume
            shutil.rmtree(final)
        os.replace(staged, final)
        _fsync_dir(root)
        try:
            staged.parent.rmdir()  # only when empty; never hides anything
        except OSError:
            pass
        maybe_fault("save-published", step)
        keep = Path(self.state.best_model_checkpoint) if self.state.best_model_checkpoint else None
        rotate(root, self.args.save_total_limit, keep)


@lru_cache(maxsize=None)
def crash_safe(trainer_cls: type) -> type:
    """`trainer_cls` with staged, atomically published checkpoints (one subclass per trainer class)."""

    class CrashSafeCheckpoints(_CrashSafeCheckpoints, trainer_cls):  # type: ignore[misc, valid-type]
        pass

    CrashSafeCheckpoints.__name__ = CrashSafeCheckpoints.__qualname__ = f"CrashSafe{trainer_cls.__name__}"
    return CrashSafeCheckpoints
