"""Reading run directories for `recipeforge report`: metrics rows, a growing file, damaged rows, the
recipe differences and the summary figures. The run files are written by the run directory's own writers."""

from __future__ import annotations

import pytest
from report_testing import make_run

from recipeforge.errors import RecipeError
from recipeforge.tools.report_runs import final_figures, read_records, read_run, read_runs, recipe_differences

def test_reads_metrics_recipe_and_series(tmp_path):
    run = read_run(make_run(tmp_path / "a", finished=True, summary=True))
    assert run.label == "a" and run.stage == "sft" and run.finished
    assert run.series("loss", "train") == ([2, 4, 6], [3.0, 2.5, 2.0])
    assert run.series("eval_loss", "eval") == ([6], [2.1])
    assert run.series("loss", "eval") == ([], [])


def test_final_figures_of_a_finished_and_a_running_run(tmp_path):
    done = final_figures(read_run(make_run(tmp_path / "done", finished=True, summary=True)))
    assert done == {"status": "finished", "steps": 6, "last loss": 2.0, "eval loss": 2.1, "tokens": 3000,
                    "wall time": 61.5}
    live_dir = make_run(tmp_path / "live")
    (live_dir / ".recipeforge.lock").write_text("{}")  # what `train` holds while it runs
    live = final_figures(read_run(live_dir))
    assert live["status"] == "in progress" and live["wall time"] == pytest.approx(100.0)  # first to latest row


def test_a_cut_off_last_line_is_left_out(tmp_path):
    root = make_run(tmp_path / "r")
    with open(root / "metrics.jsonl", "a") as fh:
        fh.write('{"split": "train", "step": 8, "loss": 1.')  # the writer is in the middle of this line
    run = read_run(root)
    assert run.partial_last_line
    assert run.series("loss", "train")[0] == [2, 4, 6]


def test_a_cut_off_line_that_parses_as_another_value_is_left_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1, "loss": 2.0}\n12')
    assert read_records(path) == ([{"split": "train", "step": 1, "loss": 2.0}], True)


@pytest.mark.parametrize("content, line, fragment", [
    ('{"split": "train", "step": 1}\nnot json\n{"split": "train", "step": 2}\n', 2, "is not valid JSON"),
    ('{"split": "train", "step": 1}\n[1, 2]\n', 2, "is a JSON list, not an object"),
    ('{"split": "train", "step": "x", "loss": 1}\n', 1, "train row without an integer `step`"),
    ('{"split": "eval", "step": 1.5}\n', 1, "without an integer `step`"),
    ('\n\n{"a": 1}\n{"b": \n', 4, "is not valid JSON"),  # a complete (newline-ended) line is never partial
])
def test_damaged_rows_are_reported_with_their_line(tmp_path, content, line, fragment):
    path = tmp_path / "metrics.jsonl"
    path.write_text(content)
    with pytest.raises(RecipeError) as err:
        read_records(path)
    problem = err.value.problems[0]
    assert problem.location.line == line and fragment in problem.message
    assert f"metrics.jsonl:{line}" in err.value.render() and "hint:" in err.value.render()


def test_non_utf8_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"split": "data", "step": 0}\n{"x": "\xff"}\n')
    with pytest.raises(RecipeError, match="row is not UTF-8 text"):
        read_records(path)


def test_not_a_run_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    started = tmp_path / "started"
    started.mkdir()
    (started / "resolved_recipe.yaml").write_text("stage: sft\n")
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / "metrics.jsonl").write_text("")
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    with pytest.raises(RecipeError) as err:
        read_runs([tmp_path / "missing", tmp_path / "empty", started, nothing, afile])
    text = err.value.render()
    assert text.startswith("5 problems:")  # every bad argument at once
    assert "missing: no such directory" in text
    assert "empty is not a run directory (no metrics.jsonl" in text
    assert "started has no metrics.jsonl yet" in text
    assert "holds no metrics yet" in text
    assert "notes.txt is not a directory" in text


def test_metrics_file_given_instead_of_its_directory(tmp_path):
    root = make_run(tmp_path / "r")
    with pytest.raises(RecipeError) as err:
        read_run(root / "metrics.jsonl")
    assert f"recipeforge report {root}" in err.value.render()


def test_labels_are_unique(tmp_path):
    a = make_run(tmp_path / "x" / "run")
    b = make_run(tmp_path / "y" / "run")
    assert [r.label for r in read_runs([a, b])] == ["x/run", "y/run"]
    assert [r.label for r in read_runs([a, a])] == ["run #1", "run #2"]
    assert [r.label for r in read_runs([a, b, a])] == ["x/run #1", "y/run", "x/run #2"]


def test_recipe_differences(tmp_path):
    a = make_run(tmp_path / "a", lr=0.01)
    b = make_run(tmp_path / "b", lr=0.002)
    c = make_run(tmp_path / "c", lr=0.01, recipe=False)
    rows = recipe_differences(read_runs([a, b, c]))
    # output.dir differs too, and logging could: neither changes what is trained.
    assert rows == [("train.learning_rate", ["0.01", "0.002", "(no recipe)"])]
    assert recipe_differences(read_runs([a, make_run(tmp_path / "same", lr=0.01)])) == []
