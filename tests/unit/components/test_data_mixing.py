"""`data.datasets[].weight` is a relative sampling weight; `data.mix_stopping` says what an epoch is."""

from __future__ import annotations

import json

import pytest

from recipeforge.components.data import load_split
from recipeforge.config.schema import DataConfig


def _write(path, prefix: str, n: int):
    path.write_text("".join(json.dumps({"instruction": f"{prefix}{i}", "output": "x"}) + "\n" for i in range(n)))


def _mix(tmp_path, specs: list[tuple[str, int, float | None]], seed: int = 0, **data):
    datasets = []
    for name, n, weight in specs:
        _write(tmp_path / f"{name}.jsonl", name, n)
        datasets.append({"path": f"{name}.jsonl", "format": "alpaca", **({"weight": weight} if weight else {})})
    train, _, stats = load_split(DataConfig(datasets=datasets, **data), ("lm",), seed=seed, base_dir=tmp_path,
                                 transform=lambda ds, fmt: ds)
    return list(train["instruction"]), stats


def _share(names: list[str], prefix: str) -> float:
    return sum(n.startswith(prefix) for n in names) / len(names)


def test_three_to_one_mix_over_an_epoch(tmp_path):
    # Same-size datasets: only the weights can make the 3:1 mix.
    names, stats = _mix(tmp_path, [("a", 2000, 3), ("b", 2000, 1)])
    assert _share(names, "a") == pytest.approx(0.75, abs=0.02)
    # all_exhausted (default): the epoch ends once every row of every dataset was drawn.
    assert {n for n in names if n.startswith("b")} == {f"b{i}" for i in range(2000)}
    assert {n for n in names if n.startswith("a")} == {f"a{i}" for i in range(2000)}
    assert stats["train_rows_by_dataset"] == [sum(n.startswith(p) for n in names) for p in "ab"]
    assert len(names) == stats["train_rows"]


def test_weights_not_sizes_decide_the_mix(tmp_path):
    names, _ = _mix(tmp_path, [("a", 3000, 1), ("b", 100, 3)])
    assert _share(names, "b") == pytest.approx(0.75, abs=0.02)


def test_first_exhausted_ends_the_epoch_when_one_dataset_runs_out(tmp_path):
    names, stats = _mix(tmp_path, [("a", 3000, 3), ("b", 3000, 1)], mix_stopping="first_exhausted")
    assert _share(names, "a") == pytest.approx(0.75, abs=0.02)
    assert stats["train_rows_by_dataset"][0] == 3000  # a ran out first ...
    assert len(names) < 4100 and len(set(names)) == len(names)  # ... and nothing repeated


def test_equal_weights_mix_half_and_half_and_do_not_lengthen_the_epoch(tmp_path):
    twos, _ = _mix(tmp_path, [("a", 1000, 2), ("b", 1000, 2)])
    ones, _ = _mix(tmp_path, [("a", 1000, 1), ("b", 1000, 1)])
    assert twos == ones  # only the ratio matters
    assert _share(twos, "a") == pytest.approx(0.5, abs=0.02)
    assert len(twos) < 2 * 2000 * 0.6


def test_the_mix_is_seeded(tmp_path):
    first, _ = _mix(tmp_path, [("a", 300, 3), ("b", 300, 1)], seed=7)
    again, _ = _mix(tmp_path, [("a", 300, 3), ("b", 300, 1)], seed=7)
    other, _ = _mix(tmp_path, [("a", 300, 3), ("b", 300, 1)], seed=8)
    assert first == again and first != other


def test_a_single_datasets_weight_is_a_no_op(tmp_path):
    weighted, stats = _mix(tmp_path, [("a", 50, 5)])
    plain, _ = _mix(tmp_path, [("a", 50, None)])
    assert weighted == plain == [f"a{i}" for i in range(50)]
    assert "train_rows_by_dataset" not in stats


def test_without_weights_every_row_is_used_once(tmp_path):
    names, _ = _mix(tmp_path, [("a", 30, None), ("b", 10, None)])
    assert names == [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(10)]


def test_a_missing_weight_counts_one(tmp_path):
    names, _ = _mix(tmp_path, [("a", 2000, None), ("b", 2000, 3)])
    assert _share(names, "b") == pytest.approx(0.75, abs=0.02)
