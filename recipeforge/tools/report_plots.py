"""The charts of a run report: which metrics are plotted, their curves, and the PNGs (matplotlib, Agg).

Which charts exist is decided from the metrics alone (`charts_for`), without matplotlib, so the data
a chart shows can be checked on its own; `draw` turns it into a figure and `figure_lines` reads the
curves back out of a figure. Several runs share each chart: one colour per run, one line style per
split (solid train, dashed eval).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recipeforge.errors import RecipeError
from recipeforge.tools.report_runs import Run

EXTRA_HINT = "install the plotting extra: pip install 'recipeforge[report]'"
STYLES = ("-", "--", ":", "-.")


@dataclass(frozen=True)
class Curve:
    """One metric of one split; `rate`: plot its increase per second (a cumulative token count)."""

    split: str
    key: str
    name: str = ""
    rate: bool = False


@dataclass(frozen=True)
class Chart:
    """One PNG: a title, a y axis and the curves every run contributes."""

    name: str                 # file stem: loss -> <report>-loss.png
    title: str
    ylabel: str
    curves: tuple[Curve, ...]


@dataclass(frozen=True)
class Line:
    """The points one run contributes to one chart."""

    label: str
    run: str
    curve: str
    steps: tuple[float, ...]
    values: tuple[float, ...]


def _pair(name: str, title: str, ylabel: str, key: str) -> Chart:
    """A train metric with its eval counterpart (`eval_<key>`), as the trainers log them."""
    return Chart(name, title, ylabel, (Curve("train", key, "train"), Curve("eval", f"eval_{key}", "eval")))


# Under the names the trainers log (metrics.jsonl); a chart is drawn only for metrics a run holds.
CHARTS: tuple[Chart, ...] = (
    _pair("loss", "Loss", "loss", "loss"),
    Chart("learning_rate", "Learning rate", "learning rate", (Curve("train", "learning_rate"),)),
    Chart("grad_norm", "Gradient norm", "grad norm", (Curve("train", "grad_norm"),)),
    Chart("tokens_per_second", "Training throughput", "tokens/s",
          (Curve("train", "num_input_tokens_seen", rate=True), Curve("train", "num_tokens", rate=True))),
    Chart("padding_share", "Padding share of the batches", "padding share", (Curve("train", "padding_share"),)),
    # DPO-like trainers: implicit rewards of the chosen and rejected answers.
    _pair("reward_margins", "Reward margin (chosen - rejected)", "margin", "rewards/margins"),
    _pair("reward_accuracies", "Reward accuracy (chosen preferred)", "accuracy", "rewards/accuracies"),
    Chart("rewards_chosen_rejected", "Rewards of chosen and rejected answers", "reward",
          (Curve("train", "rewards/chosen", "chosen"), Curve("train", "rewards/rejected", "rejected"))),
    # Reward-model training: how often and by how much chosen outscores rejected.
    _pair("pair_accuracy", "Pair accuracy", "accuracy", "accuracy"),
    _pair("score_margin", "Score margin", "margin", "margin"),
    # GRPO: the weighted total reward; each reward function gets a chart below.
    Chart("reward", "Total reward (mean)", "reward", (Curve("train", "reward"),)),
    Chart("completion_length", "Completion length (mean)", "tokens", (Curve("train", "completions/mean_length"),)),
)
_REWARD_MEAN = re.compile(r"^rewards/(.+)/mean$")  # GRPO logs rewards/<function>/mean per reward function


def charts_for(runs: list[Run]) -> list[tuple[Chart, list[Line]]]:
    """The charts with data in at least one run, each with its lines (runs without the metric add none)."""
    charts = list(CHARTS)
    functions = sorted({m.group(1) for run in runs for r in run.records if r.get("split") == "train"
                        for key in r if (m := _REWARD_MEAN.match(key))})
    charts += [Chart(f"reward_{_stem(f)}", f"Reward {f} (mean)", "reward", (Curve("train", f"rewards/{f}/mean"),))
               for f in functions]
    out = []
    for chart in charts:
        lines = chart_lines(chart, runs)
        if lines:
            out.append((chart, lines))
    return out


def chart_lines(chart: Chart, runs: list[Run]) -> list[Line]:
    """The non-empty lines of `chart`: per run, per curve; labelled with the run and the split when
    both vary."""
    lines = []
    curves_shown = [c for c in chart.curves if any(_points(run, c)[0] for run in runs)]
    for run in runs:
        for curve in curves_shown:
            steps, values = _points(run, curve)
            if not steps:
                continue
            label = run.label
            if len(curves_shown) > 1:
                label = f"{run.label} ({curve.name or curve.key})" if len(runs) > 1 else curve.name or curve.key
            lines.append(Line(label, run.label, curve.name or curve.key, tuple(steps), tuple(values)))
    return lines


def _points(run: Run, curve: Curve) -> tuple[list[float], list[float]]:
    if not curve.rate:
        return run.series(curve.key, curve.split)
    # A cumulative count becomes a rate between consecutive rows (their write times).
    rows = [r for r in run.records if r.get("split") == curve.split and isinstance(r.get(curve.key), (int, float))
            and isinstance(r.get("time"), (int, float))]
    steps, values = [], []
    for before, after in zip(rows, rows[1:]):
        seconds = after["time"] - before["time"]
        if seconds > 0 and after[curve.key] >= before[curve.key]:
            steps.append(after["step"])
            values.append((after[curve.key] - before[curve.key]) / seconds)
    return steps, values


def _stem(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "reward"


def require_matplotlib():
    """The matplotlib module, or a `RecipeError` naming the extra that installs it."""
    try:
        import matplotlib
    except ImportError:
        raise RecipeError("plotting needs matplotlib, which is not installed", hint=EXTRA_HINT) from None
    return matplotlib


def draw(chart: Chart, lines: list[Line], runs: list[str]):
    """A matplotlib `Figure` of `chart` (Agg canvas, no pyplot state); `runs` orders the colours, so a
    run keeps its colour on every chart of a report."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = [f"C{i % 10}" for i in range(len(runs))]
    curves = list(dict.fromkeys(line.curve for line in lines))
    for line in lines:
        ax.plot(line.steps, line.values, label=line.label, color=colours[runs.index(line.run)],
                linestyle=STYLES[curves.index(line.curve) % len(STYLES)],
                marker="o" if len(line.steps) <= 30 else None, markersize=3)
    ax.set_title(chart.title)
    ax.set_xlabel("step")
    ax.set_ylabel(chart.ylabel)
    ax.grid(True, alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def figure_lines(fig) -> list[tuple[str, list[float], list[float]]]:
    """(label, x, y) of every line drawn on `fig`, read back from its axes."""
    return [(line.get_label(), [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])
            for ax in fig.axes for line in ax.get_lines()]


def save_png(fig, path: Path) -> Path:
    """Write `fig` as a PNG (written aside, then moved into place: a reader never sees half a file)."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
