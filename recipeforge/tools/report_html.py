"""The report page: one self-contained HTML file (inline CSS, PNGs as base64 data URIs), so it opens
offline, from a mail attachment or an artifact store, with nothing beside it."""

from __future__ import annotations

import base64
import html
import time
from dataclasses import dataclass
from pathlib import Path

from recipeforge import __version__
from recipeforge.tools.report_runs import Run, final_figures, recipe_differences

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.95em; }
figure { display: inline-block; margin: 0.5em; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
.note { color: #8a5a00; }
"""


@dataclass(frozen=True)
class Image:
    """A chart as the page embeds it."""

    title: str
    path: Path


def render_html(runs: list[Run], images: list[Image], *, notes: list[str] = ()) -> str:
    """The report page for `runs` with `images` embedded (read from disk, base64)."""
    esc = html.escape
    names = ", ".join(run.label for run in runs)
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>recipeforge report: {esc(names)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
           f"<h1>Training report: {esc(names)}</h1>",
           f"<p>Written {esc(time.strftime('%Y-%m-%d %H:%M:%S'))} by recipeforge {esc(__version__)} from "
           f"metrics.jsonl, resolved_recipe.yaml and plan.json of each run.</p>"]
    out += ["<h2>Runs</h2>", _runs_table(runs)]
    if any(run.evals for run in runs):
        out += ["<h2>Evaluation</h2>", _eval_table(runs)]
    if any(run.checkpoint_evals for run in runs):
        out += ["<h2>Evaluation at checkpoints</h2>", _checkpoint_eval_table(runs)]
    if len(runs) > 1:
        out += ["<h2>Recipe differences</h2>", _diff_table(runs)]
    if notes:
        out += ["<ul>"] + [f'<li class="note">{esc(n)}</li>' for n in notes] + ["</ul>"]
    out.append("<h2>Charts</h2>")
    if not images:
        out.append("<p>No training metrics logged yet: the charts appear once a run has logged its first "
                   "steps (train.logging_steps).</p>")
    for image in images:
        data = base64.b64encode(image.path.read_bytes()).decode("ascii")
        out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{esc(image.title, quote=True)}" '
                   f'title="{esc(image.path.name, quote=True)}"><figcaption>{esc(image.title)} '
                   f"(<code>{esc(image.path.name)}</code>)</figcaption></figure>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _runs_table(runs: list[Run]) -> str:
    esc = html.escape
    head = ["run", "directory", "stage", "model", "backend", "status", "steps", "last loss", "eval loss",
            "tokens", "wall time"]
    rows = []
    for run in runs:
        fig = final_figures(run)
        model = ((run.recipe or {}).get("model") or {}).get("name_or_path")
        backend = (run.plan or {}).get("backend")
        cells = [esc(run.label), f"<code>{esc(str(run.root))}</code>", esc(run.stage or "?"), esc(str(model or "?")),
                 esc(str(backend or "?")), esc(fig["status"])]
        cells += [f'<td class="num">{_num(fig[k])}</td>' for k in ("steps", "last loss", "eval loss", "tokens")]
        cells.append(f'<td class="num">{_duration(fig["wall time"])}</td>')
        rows.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells) + "</tr>")
    return _table(head, rows)


def _eval_table(runs: list[Run]) -> str:
    """Scores of `recipeforge eval` (RUN_DIR/eval/<task>.json): one row per task and metric, one column per run."""
    from recipeforge.tools.evaluation.results import score_rows

    esc = html.escape
    keys: dict[tuple[str, str], None] = {}
    for run in runs:
        keys.update({(task, metric): None for task, metric, _ in score_rows(run.evals)})
    rows = []
    for task, metric in keys:
        cells = [f'<td class="num">{_num(run.evals.get(task, {}).get("scores", {}).get(metric))}</td>' for run in runs]
        rows.append(f"<tr><td>{esc(task)}</td><td>{esc(metric)}</td>{''.join(cells)}</tr>")
    return _table(["task", "metric", *(run.label for run in runs)], rows)


def _checkpoint_eval_table(runs: list[Run]) -> str:
    """Scores of the checkpoints evaluated (`recipeforge eval --checkpoints`): one row per run, checkpoint,
    task and metric."""
    from recipeforge.tools.evaluation.results import score_rows

    esc = html.escape
    rows = [f"<tr><td>{esc(run.label)}</td><td>{esc(name)}</td><td>{esc(task)}</td><td>{esc(metric)}</td>"
            f'<td class="num">{_num(value)}</td></tr>'
            for run in runs for name, results in run.checkpoint_evals.items()
            for task, metric, value in score_rows(results)]
    return _table(["run", "checkpoint", "task", "metric", "value"], rows)


def _diff_table(runs: list[Run]) -> str:
    esc = html.escape
    missing = [run.label for run in runs if run.recipe is None]
    note = (f'<p class="note">No readable resolved_recipe.yaml in: {esc(", ".join(missing))}.</p>'
            if missing else "")
    differences = recipe_differences(runs)
    if not differences:
        return note + "<p>The recipes are the same (keys that only say where and how to log or save aside).</p>"
    rows = ["<tr>" + f"<td><code>{esc(key)}</code></td>" + "".join(f"<td>{esc(v)}</td>" for v in values) + "</tr>"
            for key, values in differences]
    return note + _table(["key", *(run.label for run in runs)], rows)


def _table(head: list[str], rows: list[str]) -> str:
    return ("<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _num(value: object) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float) and not value.is_integer():
        return html.escape(f"{value:.4g}")
    return html.escape(f"{int(value):,}" if isinstance(value, (int, float)) else str(value))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "&ndash;"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
