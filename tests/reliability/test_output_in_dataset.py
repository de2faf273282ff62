"""The run's own files never land in the user's data: dataset paths are resolved before the run
directory is created, and an output.dir inside a local dataset (or holding one) is refused, exit 2,
naming both. A missing data file is reported before the run directory exists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recipeforge.cli import main

ROW = '{"instruction": "What does the cow say?", "input": "", "output": "moo"}\n'
RECIPE = """\
stage: sft
model: {{name_or_path: tiny:llama}}
hardware: {{gpus_per_node: 0}}
data:
  datasets:
    - {{path: {train}, format: alpaca}}
{extra}train: {{global_batch_size: 4, max_steps: 1}}
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text(ROW * 8)
    (tmp_path / "rows.jsonl").write_text(ROW * 8)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text(ROW * 8)
    (tmp_path / "link").symlink_to(folder)
    (tmp_path / "store" / "corpus").mkdir(parents=True)
    (tmp_path / "store" / "corpus" / "part-0.jsonl").write_text(ROW * 8)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _snapshot(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


CASES = [
    # (id, train path, eval datasets, output.dir, message)
    ("inside-dataset-dir", "corpus", "", "corpus/run", "is inside the dataset directory {root}/corpus "
                                                      "(data.datasets[0].path): the run's files would be read as data"),
    ("is-dataset-dir", "corpus", "", "corpus", "is inside the dataset directory {root}/corpus"),
    ("deep-inside", "./corpus/", "", "corpus/a/b/run", "is inside the dataset directory {root}/corpus"),
    ("through-symlink", "corpus", "", "link/run", "is inside the dataset directory {root}/corpus"),
    ("symlinked-dataset", "link", "", "corpus/run", "is inside the dataset directory {root}/corpus"),
    ("eval-dataset-dir", "rows.jsonl", "  eval_datasets:\n    - {path: corpus, format: alpaca}\n", "corpus/run",
     "is inside the dataset directory {root}/corpus (data.eval_datasets[0].path)"),
    ("holds-dataset-file", "data/rows.jsonl", "", "data",
     "the dataset {root}/data/rows.jsonl (data.datasets[0].path) is inside output.dir"),
    ("holds-dataset-dir", "store/corpus", "", "store/",
     "the dataset {root}/store/corpus (data.datasets[0].path) is inside output.dir"),
]


@pytest.mark.parametrize("train, extra, out, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_output_dir_and_dataset_overlap_is_refused(work, capsys, train, extra, out, message):
    (work / "r.yaml").write_text(RECIPE.format(train=train, extra=extra))
    before = _snapshot(work)
    assert main(["train", "r.yaml", f"output.dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: "), err
    assert message.format(root=work) in err, err
    assert "hint: set output.dir to a folder" in err
    assert _snapshot(work) == before  # not one file written, in the data or anywhere


def test_holding_a_dataset_dir_from_another_folder(work, capsys, monkeypatch):
    recipe = work / "recipes" / "r.yaml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE.format(train="../corpus", extra=""))
    sub = work / "elsewhere"
    sub.mkdir()
    assert main(["train", str(recipe), f"output.dir={work}"]) == 2
    err = capsys.readouterr().err
    assert "is the working directory" in err  # the working-directory check comes first
    capsys.readouterr()
    # From a working directory outside: the dataset check itself.
    outside = work.parent / f"{work.name}-cwd"
    outside.mkdir()
    monkeypatch.chdir(outside)
    assert main(["train", str(recipe), f"output.dir={work / 'corpus' / 'x'}"]) == 2
    assert f"inside the dataset directory {work / 'corpus'}" in capsys.readouterr().err


def test_missing_data_file_is_reported_before_the_run_directory_exists(work, capsys):
    (work / "r.yaml").write_text(RECIPE.format(train="nope.jsonl", extra=""))
    assert main(["train", "r.yaml", "output.dir=run"]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:6:8 data.datasets[0].path: data file 'nope.jsonl' not found" in err, err
    assert not (work / "run").exists()


def test_through_the_real_command_line(work):
    (work / "r.yaml").write_text(RECIPE.format(train="corpus", extra=""))
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "train", "r.yaml", "output.dir=corpus/run"],
                          capture_output=True, text=True, cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is inside the dataset directory" in errors[0] and "corpus" in errors[0]
    assert sorted(p.name for p in (work / "corpus").iterdir()) == ["part-0.jsonl"]


def test_a_run_beside_the_dataset_trains(work):
    (work / "r.yaml").write_text(RECIPE.format(train="corpus", extra=""))
    assert main(["train", "r.yaml", "output.dir=runs/ok", "logging.progress_bar=false"]) == 0
    assert (work / "runs" / "ok" / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in (work / "corpus").iterdir()) == ["part-0.jsonl"]
