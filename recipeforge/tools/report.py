"""`recipeforge report RUN_DIR [RUN_DIR ...]`: charts of one or several runs in one HTML page, and the
loss plot `train` leaves in a run directory.

Reading runs is `report_runs`, the charts `report_plots` (matplotlib, the `report` extra, imported
only here and only when drawing), the page `report_html`. The page embeds its PNGs, which are also
written next to it (``<page stem>-<chart>.png``) for use elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from recipeforge.errors import RecipeError

LOSS_PNG = "loss.png"


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote."""

    html: Path
    images: tuple[Path, ...]
    runs: tuple[str, ...]


def default_output(run_dirs: list[str]) -> Path:
    """RUN_DIR/report.html for one run; report.html in the working directory for several."""
    return Path(run_dirs[0]).expanduser() / "report.html" if len(run_dirs) == 1 else Path("report.html")


def write_report(run_dirs: list[str], out: str | Path | None = None) -> Report:
    """Read `run_dirs`, draw every chart their metrics allow and write the page to `out`."""
    from recipeforge.tools.report_html import Image, render_html
    from recipeforge.tools.report_plots import charts_for, draw, require_matplotlib, save_png
    from recipeforge.tools.report_runs import read_runs

    if not run_dirs:
        raise RecipeError("no run directory given", hint="recipeforge report RUN_DIR [RUN_DIR ...]")
    require_matplotlib()
    runs = read_runs(run_dirs)
    html_path = (Path(out).expanduser() if out is not None else default_output(run_dirs)).absolute()
    if html_path.is_dir():
        raise RecipeError(f"{out} is a directory, not a file to write the page to", key="--out",
                          hint=f"name the page to write, e.g. --out {html_path / 'report.html'}")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    labels = [run.label for run in runs]
    images = []
    for chart, lines in charts_for(runs):
        fig = draw(chart, lines, labels)
        images.append(Image(chart.title, save_png(fig, html_path.with_name(f"{html_path.stem}-{chart.name}.png"))))
    text = render_html(runs, images, notes=_notes(runs))
    tmp = html_path.with_name(f".{html_path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(html_path)
    return Report(html_path, tuple(i.path for i in images), tuple(labels))


def _notes(runs) -> list[str]:
    from recipeforge.tools.report_runs import final_figures

    notes = []
    for run in runs:
        if not run.finished:
            state = "is still training" if run.in_progress else "has no final/ model"
            notes.append(f"{run.label} {state}: the report shows its metrics up to step "
                         f"{final_figures(run)['steps']}.")
        if run.partial_last_line:
            notes.append(f"{run.label}: the last line of metrics.jsonl was being written and is left out.")
    return notes


def write_loss_plot(run_root: Path, log: Callable[[str], None] = print) -> Path | None:
    """RUN_DIR/loss.png (train and eval loss) at the end of a run; None, with one log line, when
    matplotlib is not installed or the run logged no loss. A plot never fails a finished run."""
    path = Path(run_root) / LOSS_PNG
    path.unlink(missing_ok=True)  # a resumed run's earlier plot would show only the steps before the resume
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log(f"{LOSS_PNG} not written: matplotlib is not installed (pip install 'recipeforge[report]')")
        return None
    from recipeforge.tools.report_plots import CHARTS, chart_lines, draw, save_png
    from recipeforge.tools.report_runs import read_run

    try:
        run = read_run(run_root)
    except RecipeError as exc:
        log(f"{LOSS_PNG} not written: {exc.problems[0].message}")
        return None
    chart = next(c for c in CHARTS if c.name == "loss")
    lines = chart_lines(chart, [run])
    if not lines:
        return None
    return save_png(draw(chart, lines, [run.label]), path)
