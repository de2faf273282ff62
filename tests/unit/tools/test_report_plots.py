"""The report's charts: chosen from the metrics a run holds, the curves drawn are the logged points,
one colour per run, and what happens without matplotlib."""

from __future__ import annotations

import sys

import pytest
from report_testing import make_run

from recipeforge.errors import RecipeError
from recipeforge.outputs.metrics import MetricsWriter
from recipeforge.tools.report import write_loss_plot, write_report
from recipeforge.tools.report_plots import charts_for, require_matplotlib
from recipeforge.tools.report_runs import read_runs

matplotlib = pytest.importorskip("matplotlib", reason="the report needs the `report` extra (matplotlib)")


def grpo_like(root):
    root.mkdir(parents=True)
    writer = MetricsWriter(root / "metrics.jsonl")
    for step in (1, 2, 3):
        writer.write({"split": "train", "step": step, "loss": 0.0, "reward": 0.5 * step, "rewards/fmt/mean": 0.1 * step,
                      "rewards/fmt/std": 0.0, "rewards/len gth/mean": 1.0, "completions/mean_length": 10 + step})
    return root


def test_charts_only_for_metrics_present(tmp_path):
    sft = read_runs([make_run(tmp_path / "sft")])
    assert [c.name for c, _ in charts_for(sft)] == ["loss", "learning_rate", "tokens_per_second"]
    grpo = read_runs([grpo_like(tmp_path / "grpo")])
    assert [c.name for c, _ in charts_for(grpo)] == ["loss", "reward", "completion_length", "reward_fmt",
                                                     "reward_len_gth"]  # one chart per reward function


def test_tokens_per_second_from_the_cumulative_count(tmp_path):
    # num_tokens 1000, 2000, 3000 written 10 s apart: 100 tokens/s, at the later row's step.
    (chart, lines), = [c for c in charts_for(read_runs([make_run(tmp_path / "r")])) if c[0].name == "tokens_per_second"]
    assert [(line.steps, line.values) for line in lines] == [((4, 6), (100.0, 100.0))]


def test_figure_holds_the_points_colours_follow_the_run(tmp_path):
    from recipeforge.tools.report_plots import draw, figure_lines

    runs = read_runs([make_run(tmp_path / "a", lr=0.01), make_run(tmp_path / "b", lr=0.002, losses=(4.0, 1.0))])
    charts = dict((c.name, (c, lines)) for c, lines in charts_for(runs))
    loss = draw(*charts["loss"], ["a", "b"])
    assert figure_lines(loss) == [("a (train)", [2.0, 4.0, 6.0], [3.0, 2.5, 2.0]), ("a (eval)", [6.0], [2.1]),
                                  ("b (train)", [2.0, 4.0], [4.0, 1.0]), ("b (eval)", [4.0], [1.1])]
    lr = draw(*charts["learning_rate"], ["a", "b"])
    assert [label for label, _, _ in figure_lines(lr)] == ["a", "b"]
    colour = {line.get_label(): line.get_color() for fig in (loss, lr) for line in fig.axes[0].get_lines()}
    assert colour["a"] == colour["a (train)"] == colour["a (eval)"] != colour["b"] == colour["b (train)"]
    one = draw(*charts_for(read_runs([tmp_path / "a"]))[0], ["a"])
    assert [label for label, _, _ in figure_lines(one)] == ["train", "eval"]


def test_write_report_default_output_and_pngs(tmp_path, monkeypatch):
    import matplotlib.image

    one = write_report([str(make_run(tmp_path / "a"))])
    assert one.html == tmp_path / "a" / "report.html"
    monkeypatch.chdir(tmp_path)
    two = write_report([str(tmp_path / "a"), str(make_run(tmp_path / "b"))])
    assert two.html == tmp_path / "report.html" and two.runs == ("a", "b")
    assert [p.name for p in two.images] == ["report-loss.png", "report-learning_rate.png",
                                            "report-tokens_per_second.png"]
    for png in two.images:
        assert matplotlib.image.imread(png).shape[:2] == (400, 700)


def test_loss_plot_of_a_run(tmp_path):
    import matplotlib.image

    run = make_run(tmp_path / "r")
    logged = []
    assert write_loss_plot(run, log=logged.append) == run / "loss.png"
    assert matplotlib.image.imread(run / "loss.png").shape[0] == 400 and not logged
    no_loss = tmp_path / "n"
    no_loss.mkdir()
    MetricsWriter(no_loss / "metrics.jsonl").write({"split": "train", "step": 1, "reward": 1.0})
    assert write_loss_plot(no_loss, log=logged.append) is None and not (no_loss / "loss.png").exists()


def test_without_matplotlib(tmp_path, monkeypatch):
    run = make_run(tmp_path / "r")
    (run / "loss.png").write_bytes(b"an earlier run's plot")
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets when not installed
    with pytest.raises(RecipeError) as err:
        require_matplotlib()
    assert "pip install 'recipeforge[report]'" in err.value.render()
    logged = []
    assert write_loss_plot(run, log=logged.append) is None
    assert logged == ["loss.png not written: matplotlib is not installed (pip install 'recipeforge[report]')"]
    assert not (run / "loss.png").exists()  # a stale plot would not match this run's metrics
    from recipeforge.cli import main

    assert main(["report", str(run)]) == 2
