"""Reading run directories for `recipeforge report`: metrics.jsonl, the resolved recipe and the plan.

A run may still be training: its metrics.jsonl grows while it is read, and the last line can be cut
off in the middle of a write. Such a last line (no newline after it) is left out; any other line that
is not a JSON object is a damaged file and is reported with its line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipeforge.errors import Location, Problem, RecipeError
from recipeforge.json_value import JSONValue

# Splits whose rows are points of a curve: they must say at which optimizer step they were logged.
STEPPED = ("train", "eval", "summary")
RUN_HINT = "give the output.dir of a run written by `recipeforge train`"


@dataclass
class Run:
    """One run directory as the report sees it."""

    root: Path
    label: str                               # the name curves and tables show (unique within a report)
    records: list[dict] = field(default_factory=list)
    recipe: dict | None = None               # resolved_recipe.yaml (None: missing or unreadable)
    plan: dict | None = None                 # plan.json
    finished: bool = False                   # final/ is written
    in_progress: bool = False                # a `train` holds the run's lock (or was killed holding it)
    partial_last_line: bool = False          # the last line was being written when it was read
    evals: dict = field(default_factory=dict)  # eval/<task>.json records by task (`recipeforge eval`)
    checkpoint_evals: dict = field(default_factory=dict)  # eval/checkpoint-N/<task>.json, by checkpoint

    @property
    def stage(self) -> str | None:
        stage = (self.recipe or {}).get("stage")
        return stage if isinstance(stage, str) else None

    def series(self, key: str, split: str) -> tuple[list[int], list[float]]:
        """Steps and values of one numeric metric in one split, in logging order."""
        steps, values = [], []
        for r in self.records:
            value = r.get(key)
            if r.get("split") == split and _number(value):
                steps.append(r["step"])
                values.append(float(value))
        return steps, values

    def last(self, key: str, split: str | None = None) -> Any:
        """The last logged value of `key` (of one split, or of any), None when never logged."""
        for r in reversed(self.records):
            if key in r and r[key] is not None and (split is None or r.get("split") == split):
                return r[key]
        return None


def read_runs(paths: list[str | Path]) -> list[Run]:
    """Every run of `paths`, labelled uniquely; the problems of all of them are raised together."""
    runs, problems = [], []
    for path in paths:
        try:
            runs.append(read_run(path))
        except RecipeError as exc:
            problems.extend(exc.problems)
    if problems:
        raise RecipeError(problems)
    _unique_labels(runs)
    return runs


def read_run(path: str | Path) -> Run:
    """One run directory: its metrics (required), resolved recipe and plan (when readable)."""
    root = Path(path).expanduser()
    if not root.exists():
        raise RecipeError(f"{path}: no such directory", hint=RUN_HINT)
    if not root.is_dir():
        hint = (f"give the directory that holds it: recipeforge report {root.parent}"
                if root.name == "metrics.jsonl" else RUN_HINT)
        raise RecipeError(f"{path} is not a directory", hint=hint)
    metrics = root / "metrics.jsonl"
    if not metrics.is_file():
        if (root / "resolved_recipe.yaml").is_file() or (root / "plan.json").is_file():
            raise RecipeError(f"run directory {path} has no metrics.jsonl yet",
                              hint="training writes it from its first logging step on; report the run once it "
                                   "has logged (train.logging_steps)")
        raise RecipeError(f"{path} is not a run directory (no metrics.jsonl, no resolved_recipe.yaml)",
                          hint=RUN_HINT)
    records, partial = read_records(metrics)
    if not records:
        raise RecipeError(f"{metrics} holds no metrics yet",
                          hint="training writes a row every train.logging_steps steps; report the run after that")
    from recipeforge.tools.evaluation.results import read_checkpoint_results, read_results
    from recipeforge.outputs.run_guard import read_resolved
    from recipeforge.outputs.run_lock import LOCK_NAME

    return Run(root=root, label=root.resolve().name or str(root), records=records,
               recipe=read_resolved(root / "resolved_recipe.yaml"), plan=_read_json(root / "plan.json"),
               finished=(root / "final").is_dir(), in_progress=(root / LOCK_NAME).exists(),
               partial_last_line=partial, evals=read_results(root),
               checkpoint_evals=read_checkpoint_results(root))


def read_records(path: Path) -> tuple[list[dict], bool]:
    """The rows of a metrics.jsonl file, and whether a cut-off last line was left out.

    Raises a `RecipeError` naming the line of the first row that is neither a JSON object nor the
    unfinished last line of a file still being written.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"{path} cannot be read: {exc.strerror or exc}", hint="check its permissions") from None
    lines = raw.split(b"\n")
    # A file written line by line ends with a newline; without one, the last line is still being written.
    growing = not raw.endswith(b"\n")
    records, partial = [], False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if last and growing:
                partial = True
                continue
            why = "is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else f"is not valid JSON ({exc.msg})"
            raise _row_error(path, number, f"row {why}") from None
        if not isinstance(row, dict):
            if last and growing:  # `12` cut from `123.4}`... a prefix can parse as another JSON value
                partial = True
                continue
            raise _row_error(path, number, f"row is a JSON {type(row).__name__}, not an object")
        if row.get("split") in STEPPED and not (_number(row.get("step")) and float(row["step"]).is_integer()):
            raise _row_error(path, number, f"{row['split']} row without an integer `step` "
                                           f"(got {json.dumps(row.get('step'))[:40]})")
        records.append(row)
    return records, partial


def _row_error(path: Path, line: int, message: str) -> RecipeError:
    return RecipeError(Problem(message, location=Location(str(path), line),
                               hint="metrics.jsonl holds one JSON object per line as `recipeforge train` writes "
                                    "it; repair or delete the damaged line"))


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unique_labels(runs: list[Run]) -> None:
    """Runs named alike (``a/run`` and ``b/run``) are told apart by their parent folders; the same
    directory given twice is numbered."""
    roots = [run.root.resolve() for run in runs]

    def tail(path: Path, depth: int) -> str:
        return "/".join(path.parts[-depth:])

    for run, root in zip(runs, roots):
        others = [other for other in roots if other != root]
        depth = 1
        while depth < len(root.parts) - 1 and any(tail(o, depth) == tail(root, depth) for o in others):
            depth += 1
        run.label = tail(root, depth) or str(root)
    labels = [run.label for run in runs]
    seen: dict[str, int] = {}
    for run in runs:
        if labels.count(run.label) > 1:
            seen[run.label] = seen.get(run.label, 0) + 1
            run.label = f"{run.label} #{seen[run.label]}"


def final_figures(run: Run) -> dict[str, Any]:
    """The figures a report's summary table shows for a run: status, steps, last losses, tokens, time."""
    steps = [r["step"] for r in run.records if r.get("split") in STEPPED]
    summary = next((r for r in reversed(run.records) if r.get("split") == "summary"), None)
    # The trainer's own count of tokens seen (cumulative over ranks), when it keeps one.
    tokens = run.last("num_input_tokens_seen", "train") or run.last("num_tokens", "train")
    times = [r["time"] for r in run.records if _number(r.get("time"))]
    if summary is not None and _number(summary.get("train_runtime")):
        wall = float(summary["train_runtime"])
    else:  # still training (or stopped): the time from the first row to the latest one so far
        wall = times[-1] - times[0] if len(times) > 1 else None
    return {
        "status": "finished" if run.finished else ("in progress" if run.in_progress else "unfinished"),
        "steps": int(max(steps)) if steps else 0,
        "last loss": run.last("loss", "train"),
        "eval loss": run.last("eval_loss", "eval"),
        "tokens": tokens,
        "wall time": wall,
    }


def run_summary(run: Run) -> dict[str, Any]:
    """One run's summary record, as `recipeforge report --json` prints it: the figures of the report's table
    (`final_figures`) under plain keys, the stage, and the scores of `recipeforge eval` by task."""
    figures = final_figures(run)
    return {"run": str(run.root), "label": run.label, "stage": run.stage, "status": figures["status"],
            "steps": figures["steps"], "last_loss": figures["last loss"], "eval_loss": figures["eval loss"],
            "tokens": figures["tokens"], "wall_time_s": figures["wall time"],
            "eval": {task: record.get("scores") for task, record in run.evals.items() if isinstance(record, dict)},
            "partial_last_line": run.partial_last_line}


def recipe_differences(runs: list[Run]) -> list[tuple[str, list[str]]]:
    """``(key, [value in each run])`` for every recipe key whose value is not the same in all runs
    with a readable resolved recipe (`run_guard`'s comparison: output.dir, logging and other keys
    that do not change what is trained are left out; credentials compare redacted)."""
    from recipeforge.errors import format_key
    from recipeforge.outputs.run_guard import MISSING, comparable, leaf_changes, show_value

    data = [comparable(run.recipe) if run.recipe is not None else None for run in runs]
    known = [d for d in data if d is not None]
    if len(known) < 2:
        return []
    keys: dict[tuple, None] = {}
    for other in known[1:]:
        keys.update((key, None) for key, _, _ in leaf_changes(known[0], other) if key != ())
    rows = []
    for key in sorted(keys, key=lambda k: [str(p) for p in k]):
        rows.append((format_key(key), [show_value(_at(d, key, MISSING)) if d is not None else "(no recipe)"
                                       for d in data]))
    return rows


def _at(data: JSONValue, path: tuple, missing: object) -> object:
    node = data
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return missing
    return node
