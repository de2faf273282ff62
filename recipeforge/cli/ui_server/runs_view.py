"""The runs page's data: every run under the runs folder, each one's status, metrics, plan, resolved recipe,
eval scores and log, and the diff of two runs' recipes.

Status comes from the run directory's own records as `recipeforge mcp`'s status tool reads them
(`mcp_server.runs`): a live holder of the run lock is running, final/ finished; a run this server started
also has its exit status (75: preempted after saving a checkpoint). The report, diff and status records
are those `recipeforge report --json`, `diff --json` and the MCP tools return.

Nothing outside the runs folder is read: a run directory whose records are links out of it is refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from recipeforge.cli.mcp_server.records import Record, as_data, diff, report
from recipeforge.cli.mcp_server.runs import Runs, is_run_dir, run_path
from recipeforge.cli.ui_server.access import NotFound, Refused, confined, inside
from recipeforge.errors import RecipeError

MAX_DEPTH = 2             # runs/<name> and runs/<group>/<name>
MAX_RUNS = 500
MAX_TEXT = 2_000_000      # the largest record file shown (a resolved recipe, a plan)
LOG_BYTES = 64_000        # the end of a run's log the page shows


class RunsView:
    """The runs under `root` (a folder), and the `Runs` this server started (launch and stop)."""

    def __init__(self, root: Path, runs: Runs):
        self.root = root.resolve()
        self.runs = runs

    def find(self, name: object) -> Path:
        """The run directory `name` (relative to the runs folder); `Refused` outside it, `NotFound` when it
        is not a run (nor one this server started that has not written its directory yet)."""
        path = confined(self.root, name, what="run")
        if not (path.is_dir() and is_run_dir(path)) and not self._started(path):
            raise NotFound(f"{name} is not a run directory under {self.root}",
                           hint="pick a run from the list (a folder with metrics.jsonl, plan.json, ...)")
        self._check_links(path)
        return path

    def listing(self) -> list[Record]:
        """Every run under the folder (depth 2), sorted by name, with its status; a run this server started
        is listed as soon as it starts, before it writes its directory."""
        found: dict[Path, None] = {}
        self._walk(self.root, 0, found)
        found.update((p, None) for p in self._started_paths() if p.is_relative_to(self.root))
        rows = []
        for path in sorted(found):
            name = path.relative_to(self.root).as_posix()
            rows.append({"name": name, **self._status_row(path)})
        return rows

    def detail(self, name: object) -> Record:
        """One run: its status, plan, resolved recipe, eval scores (the `report --json` record) and whether
        this server started it (it can stop it)."""
        path = self.find(name)
        status = self.status(path)
        record: Record = {"name": path.relative_to(self.root).as_posix(), "status": status,
                          "started_here": self._started(path),
                          "plan": _json_file(path / "plan.json"),
                          "resolved_recipe": _text_file(path / "resolved_recipe.yaml"),
                          "report": None}
        if (path / "metrics.jsonl").is_file():
            record["report"] = as_data(report, argparse.Namespace(run_dir=str(path)))
        return record

    def status(self, path: Path) -> Record:
        """The status record of `mcp`'s status tool for the run directory `path`."""
        return self.runs.status(str(path))

    def metrics(self, name: object, since: int) -> Record:
        """The metrics.jsonl rows from row `since` on (numbers only, by split and step), and the count to ask
        from next time: the page's charts add these points while the run trains."""
        path = self.find(name)
        metrics = path / "metrics.jsonl"
        if not metrics.is_file():
            return {"rows": [], "next": 0, "partial_last_line": False}
        from recipeforge.tools.report_runs import read_records

        records, partial = read_records(metrics)
        since = max(0, min(since, len(records)))
        rows = [{k: v for k, v in r.items() if k in ("split", "step") or _number(v)} for r in records[since:]]
        return {"rows": rows, "next": len(records), "partial_last_line": partial}

    def log(self, name: object) -> Record:
        """The end of the run's training log (``<run>.train.log`` beside it, as a launch writes it)."""
        path = confined(self.root, name, what="run")
        log = path.with_name(path.name + ".train.log")
        if not log.is_file() or not inside(self.root, log):
            return {"log": None, "text": ""}
        from recipeforge.config.secrets import scrub

        with open(log, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - LOG_BYTES))
            text = fh.read().decode("utf-8", errors="replace")
        lines = text.splitlines()[1:] if size > LOG_BYTES else text.splitlines()
        # Progress bars rewrite their line with \r: the page shows each line's last state.
        return {"log": log.name, "text": "\n".join(scrub(line.rsplit("\r", 1)[-1]) for line in lines)}

    def diff(self, a: object, b: object) -> Record:
        """`recipeforge diff A B --json` of two runs' recipes (their resolved recipes and lock files)."""
        first, second = self.find(a), self.find(b)
        return as_data(diff, argparse.Namespace(a=str(first), b=str(second)))

    def _status_row(self, path: Path) -> Record:
        try:
            self._check_links(path)
            status = self.status(path)
        except RecipeError as exc:
            return {"state": "unreadable", "error": exc.problems[0].message if exc.problems else str(exc)}
        recipe = _json_safe_stage(path / "resolved_recipe.yaml")
        return {"state": status["state"], "last_step": status["last_step"], "last_loss": status["last_loss"],
                "resumable": status["resumable"], "stage": recipe, "started_here": self._started(path)}

    def _walk(self, folder: Path, depth: int, found: dict[Path, None]) -> None:
        try:
            children = sorted(folder.iterdir())
        except OSError:
            return
        for child in children:
            if len(found) >= MAX_RUNS:
                return
            if child.name.startswith(".") or not child.is_dir() or not inside(self.root, child):
                continue
            if is_run_dir(child):
                found[child] = None
            elif depth + 1 < MAX_DEPTH:
                self._walk(child, depth + 1, found)

    def _check_links(self, path: Path) -> None:
        """Refuse a run directory whose records (or eval results) are links out of the runs folder."""
        entries = [path / n for n in ("metrics.jsonl", "resolved_recipe.yaml", "plan.json", "recipe.lock.yaml",
                                      ".recipeforge.lock", "eval", "final", "checkpoints")]
        if (path / "eval").is_dir() and inside(self.root, path / "eval"):
            entries += list((path / "eval").rglob("*"))[:1000]
        for entry in entries:
            if (entry.exists() or entry.is_symlink()) and not inside(self.root, entry):
                raise Refused(f"{entry.relative_to(self.root)} is a link out of the runs folder",
                              hint="the UI reads only files whose real location is inside the runs folder")

    def _started(self, path: Path) -> bool:
        return run_path(path) in self._started_paths()

    def _started_paths(self) -> list[Path]:
        return self.runs.started_dirs()


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_file(path: Path) -> Any:
    text = _text_file(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _text_file(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_TEXT:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _json_safe_stage(path: Path) -> str | None:
    """The stage a run's resolved recipe names (for the list), without reading more of it than needed."""
    text = _text_file(path)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("stage:"):
            return line.partition(":")[2].strip().strip("'\"") or None
    return None
