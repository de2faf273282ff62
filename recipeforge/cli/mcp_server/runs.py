"""Training runs the MCP server starts, watches and stops.

`train` validates the recipe in this process (a refused recipe, override or code without the opt-in never
starts anything), then starts ``python -m recipeforge train RECIPE [overrides]`` as a process of its own
(an argv list, no shell; its own session, so it outlives the server), with its output in
``<run dir>.train.log`` beside the run directory. `status` reads the run directory's own records: the
run lock's holder (running), final/ (finished), checkpoints/ and metrics.jsonl, plus the exit status of a
process this server started (75: preempted, another: failed). `stop` sends SIGTERM, the preemption
signal (a checkpoint is saved, the same `train` resumes), only to a process this server started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipeforge.errors import RecipeError
from recipeforge.cli.mcp_server.records import Record, check_overrides

EXIT_PREEMPTED = 75  # recipeforge.cli.exit_codes.EXIT_TERMINATED: stopped after saving a checkpoint


@dataclass
class Started:
    """A `train` process this server started."""

    process: subprocess.Popen[bytes]
    run_dir: Path
    log: Path
    argv: list[str]


class Runs:
    """The runs this server started, by run directory; the only processes `stop` may signal."""

    def __init__(self, trust_code: bool = False):
        self.trust_code = trust_code
        self._started: dict[Path, Started] = {}
        self._lock = threading.Lock()

    def train(self, args: argparse.Namespace) -> Record:
        """Validate `args.recipe` with its overrides as `train` does, then start the run; returns its run
        directory, pid, log file and command."""
        from recipeforge.cli.common import load
        from recipeforge.outputs.run_dir import default_run_dir
        from recipeforge.outputs.run_lock import LOCK_NAME

        check_overrides(args.overrides)
        loaded = load(args)  # the recipe, the overrides and the code opt-in, checked before anything runs
        run_dir = run_path(default_run_dir(loaded.recipe, loaded.path))
        with self._lock:
            earlier = self._started.get(run_dir)
            if earlier is not None and earlier.process.poll() is None:
                raise RecipeError(f"this server's run in {run_dir} is still training (pid {earlier.process.pid})",
                                  key="output.dir", hint="stop it first, or choose another output.dir")
            holder = _read_json(run_dir / LOCK_NAME)
            if holder is not None and _holder_alive(holder):
                raise RecipeError(f"{run_dir} is in use by another run (pid {holder.get('pid')} on "
                                  f"{holder.get('host')})", key="output.dir",
                                  hint="wait for it to end (status), or choose another output.dir")
            argv = train_argv(args.recipe, args.overrides, trust_code=self.trust_code)
            log = run_dir.with_name(run_dir.name + ".train.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as out:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=True, close_fds=True)
            self._started[run_dir] = Started(process, run_dir, log, argv)
        return {"run_dir": str(run_dir), "pid": process.pid, "log": str(log), "command": argv[1:]}

    def started_dirs(self) -> list[Path]:
        """The run directories of the runs this server started."""
        with self._lock:
            return list(self._started)

    def status(self, run_dir: str) -> Record:
        """Where a run stands, from its run directory (and the exit status of a process this server started)."""
        root = run_path(run_dir)
        started = self._started.get(root)
        code = started.process.poll() if started is not None else None
        alive = started is not None and code is None
        if started is None and not root.is_dir():  # a run this server started is known before its directory
            raise RecipeError(f"{run_dir}: no such run directory",
                              hint="give the run_dir the train tool returned (the recipe's output.dir)")
        if started is None and not is_run_dir(root):
            raise RecipeError(f"{run_dir} is not a run directory (no metrics.jsonl, resolved_recipe.yaml, plan.json, "
                              f"checkpoints or final/)", hint="give the run_dir the train tool returned (the "
                                                              "recipe's output.dir)")
        record = run_status(root, exit_code=code, process_alive=alive)
        if started is not None:
            record.update(pid=started.process.pid, log=str(started.log), exit_code=code)
            if code not in (None, 0):
                record["log_tail"] = _tail(started.log)
        return record

    def stop(self, run_dir: str) -> Record:
        """SIGTERM to the run this server started in `run_dir`: it saves a checkpoint and exits with 75."""
        root = run_path(run_dir)
        started = self._started.get(root)
        if started is None:
            raise RecipeError(f"this server started no run in {run_dir}",
                              hint="stop signals only the processes its train tool started")
        if started.process.poll() is not None:
            return {"run_dir": str(root), "pid": started.process.pid, "stopped": False,
                    "exit_code": started.process.returncode, "message": "the run had already ended"}
        started.process.send_signal(signal.SIGTERM)  # by the recorded Popen: its pid, not reused while unreaped
        return {"run_dir": str(root), "pid": started.process.pid, "stopped": True, "signal": "SIGTERM",
                "message": "the run saves a checkpoint at the end of its step and exits (status: preempted); "
                           "train the same recipe again to resume"}


def train_argv(recipe: str | Path, overrides: list[str], *, trust_code: bool) -> list[str]:
    """The command a server starts to train `recipe`: an argument list for `subprocess`, never a shell line.
    --trust-code only when the server itself was started with it: a tool never adds it."""
    return [sys.executable, "-m", "recipeforge", *(["--trust-code"] if trust_code else []), "train",
            str(Path(recipe).absolute()), *overrides]


def run_path(path: str | Path) -> Path:
    """A run directory as this server keys it: absolute from its working directory, `~` and `..` resolved
    (not symlinks), so `runs/x`, `./runs/x` and `/abs/runs/x` name one run."""
    return Path(os.path.abspath(Path(path).expanduser()))


def run_status(root: Path, *, exit_code: int | None = None, process_alive: bool = False) -> Record:
    """running / finished / preempted / failed / stopped from the run directory's records: the run lock's
    live holder, final/, the exit status when known, and checkpoints/ (a stop of unknown cause that left a
    checkpoint, or a process killed by SIGTERM before it could handle it: `stopped`); with the last step and
    loss of metrics.jsonl. `resumable`: it ended with a checkpoint to continue from."""
    from recipeforge.outputs.run_lock import LOCK_NAME

    holder = _read_json(root / LOCK_NAME)
    checkpoints = sorted(p.name for p in (root / "checkpoints").glob("checkpoint-*") if p.is_dir())
    if (holder is not None and _holder_alive(holder)) or process_alive:
        state = "running"
    elif (root / "final").is_dir():
        state = "finished"
    elif exit_code == EXIT_PREEMPTED:
        state = "preempted"
    elif exit_code == -signal.SIGTERM:  # the stop signal came before `train` could handle it (start-up)
        state = "stopped"
    elif exit_code is not None and exit_code != 0:
        state = "failed"
    else:
        state = "stopped" if checkpoints else "failed"
    step, loss, partial = _last_train_row(root / "metrics.jsonl")
    return {"run_dir": str(root), "state": state, "last_step": step, "last_loss": loss,
            "checkpoints": checkpoints, "final": (root / "final").is_dir(), "metrics_partial_last_line": partial,
            "resumable": state not in ("running", "finished") and bool(checkpoints)}


def is_run_dir(root: Path) -> bool:
    """Whether `root` holds any record `recipeforge train` writes in a run directory."""
    from recipeforge.outputs.run_lock import LOCK_NAME

    files = ("metrics.jsonl", "resolved_recipe.yaml", "plan.json", "recipe.lock.yaml", LOCK_NAME)
    return any((root / name).is_file() for name in files) or any((root / d).is_dir() for d in ("final", "checkpoints"))


def _holder_alive(holder: dict[str, Any]) -> bool:
    """Whether the process recorded as holding the run lock still lives (another host: assumed to)."""
    if holder.get("host") not in (None, socket.gethostname()):
        return True
    try:
        os.kill(int(holder.get("pid", -1)), 0)
    except (ProcessLookupError, ValueError, TypeError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _last_train_row(path: Path) -> tuple[int | None, float | None, bool]:
    if not path.is_file():
        return None, None, False
    from recipeforge.tools.report_runs import read_records

    try:
        records, partial = read_records(path)
    except RecipeError:
        return None, None, False
    steps = [r["step"] for r in records if r.get("split") == "train" and isinstance(r.get("step"), int)]
    losses = [r["loss"] for r in records if r.get("split") == "train" and isinstance(r.get("loss"), (int, float))]
    return (max(steps) if steps else None), (losses[-1] if losses else None), partial


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, lines: int = 20) -> str:
    """The last lines of a run's log (what `train` said when it failed), secrets hidden."""
    from recipeforge.config.secrets import scrub
    from recipeforge.errors import bounded_text

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(bounded_text(scrub(line)) for line in text.splitlines()[-lines:])
