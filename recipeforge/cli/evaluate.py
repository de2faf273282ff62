"""The commands that measure runs: eval (benchmarks with lm-evaluation-harness; several runs compared) and
report (charts of one or several runs in one HTML page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.cli.common import library_warnings_to
from recipeforge.errors import RecipeError
from recipeforge.log import log

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_report(sub: Subparsers) -> None:
    p = sub.add_parser("report", help="charts of one or several runs (loss, learning rate, rewards, ...) in one "
                                      "self-contained HTML page",
                       description="Read metrics.jsonl, resolved_recipe.yaml and plan.json of each run (finished or "
                                   "still training) and write one HTML page with the charts embedded, plus the "
                                   "PNGs next to it. Several runs are overlaid, with a table of their recipe "
                                   "differences. Needs matplotlib: pip install 'recipeforge[report]' (not for "
                                   "--json).")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory written by `recipeforge train`")
    p.add_argument("--out", metavar="FILE.html",
                   help="page to write (default: RUN_DIR/report.html for one run, ./report.html for several)")
    p.add_argument("--json", action="store_true",
                   help="print each run's summary (status, steps, last loss, eval scores) as JSON; writes no page")
    p.set_defaults(func=cmd_report)


def report_records(run_dirs: list[str]) -> list[dict[str, Any]]:
    """The summary record of each run, as `report --json` prints them (raises `RecipeError`)."""
    from recipeforge.tools.report_runs import read_runs, run_summary

    return [run_summary(run) for run in read_runs(list[str | Path](run_dirs))]


def cmd_report(args: argparse.Namespace) -> int:
    if args.json:
        import json

        print(json.dumps(report_records(args.run_dirs), indent=2, default=str))
        return 0
    from recipeforge.tools.report import write_report

    report = write_report(args.run_dirs, args.out)
    print(f"report of {', '.join(report.runs)} written to {report.html} ({len(report.images)} charts)")
    return 0


def add_eval(sub: Subparsers) -> None:
    p = sub.add_parser("eval", help="benchmark a finished run's model with lm-evaluation-harness; two runs: a "
                                    "comparison table",
                       description="Evaluate final/ of a run (a LoRA adapter on its base, not merged) with "
                                   "EleutherAI's lm-evaluation-harness (HF backend) on lm-eval tasks by name and "
                                   "local tasks (a .jsonl of {prompt, reference} or {prompt, choices, answer} rows, "
                                   "or an lm-eval task .yaml). Scores go to RUN_DIR/eval/<task>.json, the model "
                                   "card and `recipeforge report`. Needs lm-eval: pip install 'recipeforge[eval]'.")
    p.add_argument("targets", nargs="+", metavar="RUN_DIR|RECIPE",
                   help="run directory, or the recipe that trained it; several: evaluated on the same tasks and "
                        "compared")
    p.add_argument("--tasks", nargs="+", metavar="TASK",
                   help="lm-eval task names or local task files, space- or comma-separated (default: the "
                        "recipe's eval.tasks)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="prompts per forward pass (default: eval.batch_size, else 8 on the CPU and lm-eval's "
                        "out-of-memory-safe `auto` on a GPU)")
    p.add_argument("--limit", type=int, metavar="N", help="evaluate only the first N examples of each task")
    p.add_argument("--checkpoints", action="store_true",
                   help="also evaluate every checkpoint kept in RUN_DIR/checkpoints (into eval/checkpoint-N/)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="where the model runs (default: cuda when present)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON record on stdout: each run's scores by subject (final, checkpoint-N) "
                        "and task, with the file each is kept in; an error is printed as {\"error\": {message, "
                        "location, key, hint}} (exit 2)")
    p.set_defaults(func=cmd_eval, cleans_up=True, pauses_collector=True)


def cmd_eval(args: argparse.Namespace) -> int:
    if not args.json:
        return _print_scores(_evaluate(args))
    # stdout carries the record alone: what the libraries print while they evaluate goes to stderr
    import contextlib
    import json

    from recipeforge.cli.exit_codes import EXIT_USER_ERROR
    from recipeforge.cli.error_data import error_record

    try:
        with contextlib.redirect_stdout(sys.stderr):
            done = _evaluate(args)
    except RecipeError as exc:
        print(json.dumps(error_record(exc)))
        return EXIT_USER_ERROR
    print(json.dumps(eval_record(done), indent=2))
    return 0


Evaluated = list[tuple[Path, dict[str, dict[str, dict[str, Any]]]]]


def _evaluate(args: argparse.Namespace) -> Evaluated:
    """Evaluate the targets as the flags say: (run dir, records by task by subject) per run."""
    from recipeforge.tools.evaluation.command import evaluate_targets

    for flag, value in (("--batch-size", args.batch_size), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise RecipeError(f"{flag} must be 1 or more", key=flag)
    # Library noise goes to logs/warnings.log of the first run, as in `chat`.
    with library_warnings_to(Path(args.targets[0])):
        tasks = [t for arg in args.tasks or () for t in arg.split(",") if t]  # lm-eval's own --tasks a,b too
        return evaluate_targets(args.targets, tasks=tasks, batch_size=args.batch_size, limit=args.limit,
                                device=args.device, checkpoints=args.checkpoints, log=log)


def _score_file(run_dir: Path, subject: str, task: str) -> Path:
    """Where `recipeforge eval` keeps one task's scores of one subject (final/ or a checkpoint)."""
    where = run_dir / "eval" if subject == "final" else run_dir / "eval" / subject
    return where / f"{task}.json"


def eval_record(done: Evaluated) -> dict[str, Any]:
    """What `eval --json` prints: per run, its directory and, by subject and task, the scores, the number
    of examples and the file they are kept in."""
    return {"runs": [{"run_dir": str(run_dir),
                      "subjects": {subject: {task: {"scores": _finite(record["scores"]), "samples": record["samples"],
                                                    "file": str(_score_file(run_dir, subject, task))}
                                             for task, record in records.items()}
                                   for subject, records in subjects.items()}}
                     for run_dir, subjects in done]}


def _finite(scores: dict[str, Any]) -> dict[str, Any]:
    """`scores` with NaN and infinite values as None (JSON has neither; lm-eval gives NaN for a stderr it
    cannot compute)."""
    import math

    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in scores.items()}


def _print_scores(done: Evaluated) -> int:
    """The scores as text: one line per task (and checkpoint), or a comparison table of several runs."""
    from recipeforge.tools.evaluation.results import comparison_table, format_score

    if len(done) > 1:
        sys.stdout.write(comparison_table([str(run) for run, _ in done], [subjects["final"] for _, subjects in done]))
        return 0
    run_dir, subjects = done[0]
    for subject, records in subjects.items():
        for name, record in records.items():
            scores = ", ".join(f"{k} {format_score(v)}" for k, v in record["scores"].items())
            label = name if subject == "final" else f"{subject} {name}"
            print(f"{label}: {scores} ({record['samples']} examples) -> {_score_file(run_dir, subject, name)}")
    return 0
