"""Reading datasets: file types, relative paths, column remapping, mixing and the held-out split."""

from __future__ import annotations

import json

import pytest

from recipeforge.components.data import DatasetRef, load_raw, load_split, looks_local, remap_and_check
from recipeforge.components.formats import get_format
from recipeforge.config.schema import DataConfig, DatasetSpec
from recipeforge.errors import RecipeError

ROWS = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(10)]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ref(path, fmt="alpaca", **kw):
    return DatasetRef(DatasetSpec(path=str(path), format=fmt, **kw), "datasets", 0)


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv", "parquet"])
def test_file_types(tmp_path, suffix):
    import pandas as pd

    path = tmp_path / f"d.{suffix}"
    frame = pd.DataFrame(ROWS)
    {"jsonl": lambda: frame.to_json(path, orient="records", lines=True),
     "json": lambda: frame.to_json(path, orient="records"),
     "csv": lambda: frame.to_csv(path, index=False),
     "parquet": lambda: frame.to_parquet(path)}[suffix]()
    ds = load_raw(_ref(path), base_dir=tmp_path)
    assert len(ds) == 10 and set(ds.column_names) == {"instruction", "output"}


def test_txt_is_one_text_row_per_line(tmp_path):
    (tmp_path / "d.txt").write_text("one line\nanother line\n")
    ds = load_raw(_ref("d.txt", fmt="text"), base_dir=tmp_path)
    assert ds["text"] == ["one line", "another line"]


def test_relative_paths_start_at_the_recipe_folder(tmp_path, monkeypatch):
    sub = tmp_path / "recipes"
    sub.mkdir()
    _write(sub / "d.jsonl", ROWS)
    monkeypatch.chdir(tmp_path)
    assert len(load_raw(_ref("d.jsonl"), base_dir=sub)) == 10


def test_local_looking_paths_are_not_hub_ids():
    assert looks_local("data/train.jsonl") and looks_local("./x") and looks_local("/abs/dir")
    assert not looks_local("tatsu-lab/alpaca")


def test_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="data file 'nope.jsonl' not found"):
        load_raw(_ref("nope.jsonl"), base_dir=tmp_path)


def test_unsupported_suffix(tmp_path):
    (tmp_path / "d.xml").write_text("<a/>")
    with pytest.raises(RecipeError, match="unsupported data file type '.xml'"):
        load_raw(_ref(tmp_path / "d.xml"), base_dir=tmp_path)


def test_remap_and_required_columns(tmp_path):
    _write(tmp_path / "d.jsonl", [{"question": "q", "answer": "a", "extra": 1}])
    ref = _ref("d.jsonl", columns={"instruction": "question", "output": "answer"})
    ds = remap_and_check(load_raw(ref, base_dir=tmp_path), ref, get_format("alpaca"))
    assert {"instruction", "output"} <= set(ds.column_names)
    bad = _ref("d.jsonl")
    with pytest.raises(RecipeError) as info:
        remap_and_check(load_raw(bad, base_dir=tmp_path), bad, get_format("alpaca"))
    assert "columns found: question, answer, extra" in str(info.value)


def _split(tmp_path, **data):
    cfg = DataConfig(**data)
    return load_split(cfg, ("lm",), seed=0, base_dir=tmp_path, transform=lambda ds, fmt: ds)


def test_val_share_and_count(tmp_path):
    _write(tmp_path / "d.jsonl", ROWS)
    train, evaluation, stats = _split(tmp_path, datasets=[{"path": "d.jsonl", "format": "alpaca"}], val_size=0.2)
    assert (len(train), len(evaluation)) == (8, 2)
    assert not set(train["instruction"]) & set(evaluation["instruction"])
    train, evaluation, _ = _split(tmp_path, datasets=[{"path": "d.jsonl", "format": "alpaca"}], val_size=3)
    assert (len(train), len(evaluation)) == (7, 3)
    with pytest.raises(RecipeError, match="leaves no training rows"):
        _split(tmp_path, datasets=[{"path": "d.jsonl", "format": "alpaca"}], val_size=10)


def test_weights_sample_datasets(tmp_path):
    # Sampling weights, not repeat counts (tests/unit/components/test_data_mixing.py has the details).
    _write(tmp_path / "a.jsonl", ROWS)
    _write(tmp_path / "b.jsonl", [{"instruction": f"b{i}", "output": "x"} for i in range(4)])
    train, _, stats = _split(tmp_path, datasets=[{"path": "a.jsonl", "format": "alpaca", "weight": 0.5},
                                                 {"path": "b.jsonl", "format": "alpaca", "weight": 2}])
    names = train["instruction"]
    assert set(names) == {r["instruction"] for r in ROWS} | {f"b{i}" for i in range(4)}  # every row drawn
    assert stats["train_rows_by_dataset"] == [sum(not n.startswith("b") for n in names),
                                              sum(n.startswith("b") for n in names)]


def test_eval_datasets_and_max_samples(tmp_path):
    _write(tmp_path / "a.jsonl", ROWS)
    _write(tmp_path / "e.jsonl", ROWS[:3])
    train, evaluation, stats = _split(tmp_path, datasets=[{"path": "a.jsonl", "format": "alpaca", "max_samples": 4}],
                                      eval_datasets=[{"path": "e.jsonl", "format": "alpaca"}])
    assert (len(train), len(evaluation)) == (4, 3) and stats == {"train_rows": 4, "eval_rows": 3}
    assert "_row" in train.column_names  # source row numbers travel along for error messages
