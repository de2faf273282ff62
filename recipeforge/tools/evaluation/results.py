"""Evaluation results in a run directory: RUN_DIR/eval/<task>.json, read back for the model card,
`recipeforge report` and the comparison of runs. Light: no lm-eval, no torch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

EVAL_DIR = "eval"
# lm-eval's per-task bookkeeping next to the scores: not a score.
_NOT_SCORES = {"alias", "name", "sample_len", "samples"}


def fingerprint(samples: list[dict]) -> str:
    """sha256 of the exact requests the model was given (prompt, continuation or generation settings),
    in document order: two results with the same fingerprint scored the same inputs."""
    ordered = sorted(samples, key=lambda s: s.get("doc_id", 0))
    text = json.dumps([[s.get("doc_id"), s.get("arguments")] for s in ordered], default=str, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_scores(task_results: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """lm-eval's ``{"acc,none": .5, "acc_stderr,none": .1}`` as scores ``{"acc": .5}`` and standard
    errors ``{"acc": .1}``; a filter other than ``none`` stays in the name: ``exact_match (strict-match)``."""
    scores, stderr = {}, {}
    for key, value in task_results.items():
        if key in _NOT_SCORES:
            continue
        metric, _, filt = key.partition(",")
        target = stderr if metric.endswith("_stderr") else scores
        metric = metric.removesuffix("_stderr")
        name = metric if filt in ("", "none") else f"{metric} ({filt})"
        target[name] = value
    return scores, stderr


def write_result(out_dir: Path, name: str, record: dict[str, Any]) -> Path:
    """<out_dir>/<name>.json (RUN_DIR/eval/ for final/), replaced whole (written beside it, then renamed)."""
    out = Path(out_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def read_results(run_dir: Path, *, here: bool = False) -> dict[str, dict[str, Any]]:
    """Every readable eval/<task>.json of a run (`here`: <task>.json of `run_dir` itself), by task name
    (unreadable files are left out)."""
    results = {}
    for path in sorted((Path(run_dir) if here else Path(run_dir) / EVAL_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("scores"), dict):
            results[path.stem] = record
    return results


def read_checkpoint_results(run_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """The results of the checkpoints evaluated (eval/checkpoint-N/<task>.json), by checkpoint, oldest first."""
    found = [(int(d.name.rsplit("-", 1)[1]), d) for d in (Path(run_dir) / EVAL_DIR).glob("checkpoint-*")
             if d.is_dir() and d.name.rsplit("-", 1)[1].isdigit()]
    return {d.name: results for _, d in sorted(found) if (results := read_results(d, here=True))}


def score_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(task, metric, value) of every score, tasks and metrics in order."""
    return [(task, metric, value) for task, record in sorted(results.items())
            for metric, value in record["scores"].items()]


def format_score(value: object) -> str:
    """A score as tables show it: four significant digits, or the value as text."""
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def markdown_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The model card's evaluation table (lines), empty without results."""
    rows = score_rows(results)
    if not rows:
        return []
    lines = ["| task | metric | value | examples |", "|---|---|---|---|"]
    for task, metric, value in rows:
        lines.append(f"| {task} | {metric} | {format_score(value)} | {results[task].get('samples', '')} |")
    return lines


def comparison_table(labels: list[str], results: list[dict[str, dict[str, Any]]]) -> str:
    """A plain-text table of the scores of several runs side by side (one row per task and metric)."""
    keys: dict[tuple[str, str], None] = {}
    for run in results:
        keys.update({(task, metric): None for task, metric, _ in score_rows(run)})
    head = ["task", "metric", *labels]
    body = [[task, metric, *(format_score(run[task]["scores"][metric]) if metric in run.get(task, {}).get(
        "scores", {}) else "-" for run in results)] for task, metric in keys]
    widths = [max(len(str(row[i])) for row in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in [head, *body]) + "\n"
