"""bench/gpu/ledger.py: what a GPU lease runs first (never measured, then failed, then changed since,
then current), read from the results files the suite writes and the modules a run imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import ledger  # noqa: E402

IMPORTS = """import time: self [us] | cumulative | imported package
import time:       120 |        120 |   recipeforge.stages.base
import time:        80 |         80 |     recipeforge.components.model_init
import time:        50 |         50 |   transformers.trainer
import time:        30 |         30 | recipeforge_liger
[rank0]:import time:    40 |         40 |   recipeforge.backends.sharded_loading
"""


def _result(case: str, status: str = "ok", deps: dict | None = None, date: str = "2026-11-20") -> dict:
    return {"accelerator": "H100-80GB", "date": date, "flop_convention": "6N",
            "cases": [{"case": case, "status": status, "tokens_per_s": 1000.0, "deps": deps or {}}]}


def test_a_run_depends_on_the_repository_modules_it_imported():
    deps = ledger.deps_of(IMPORTS, [BENCH / "common.py"])
    assert set(deps) == {"recipeforge/stages/base.py", "recipeforge/components/model_init.py",
                         "plugins/recipeforge-liger/src/recipeforge_liger/__init__.py", "bench/gpu/common.py",
                         "recipeforge/backends/sharded_loading.py"}  # a launched worker's line, prefixed
    assert all(len(h) == 12 for h in deps.values()) and ledger.changed(deps) == []
    assert ledger.changed({**deps, "recipeforge/stages/base.py": "0" * 12}) == ["recipeforge/stages/base.py"]


def test_the_next_lease_runs_the_unknown_first_and_the_current_last():
    names = ledger.case_names("suite")
    current = ledger.deps_of(IMPORTS, [])
    stale = {**current, "recipeforge/stages/base.py": "0" * 12}
    book = {"entries": []}
    ledger.record(book, _result(names[0], deps=current), commit="a")        # measured on this code
    ledger.record(book, _result(names[1], deps=stale, date="2026-11-21"), commit="a")  # its files changed since
    ledger.record(book, _result(names[2], status="train failed (exit 1)"), commit="a")
    ledger.record(book, _result(names[3], deps=stale, date="2026-11-19"), commit="a")  # changed, measured earlier
    ledger.record(book, {**_result(names[4]), "cases": [{"case": names[4], "status": "skipped"}]}, commit="a")
    order = ledger.next_cases(book, "H100-80GB")
    ranked = [name for name, _ in order]
    never = [n for n in names if n not in names[:4]]
    assert ranked == [*never, names[2], names[3], names[1], names[0]]
    assert "base.py" in dict(order)[names[1]] and dict(order)[names[4]] == "never measured on any GPU"
    # another GPU has measured nothing: what no GPU has measured comes before what this one has not
    elsewhere = [names[0], names[1], names[3]]
    other = ledger.next_cases(book, "H200-141GB")
    assert [n for n, _ in other] == [n for n in names if n not in elsewhere] + elsewhere
    assert dict(other)[names[0]] == "never measured on this GPU (measured on H100-80GB)"


def test_recording_replaces_the_last_measurement_of_a_case(tmp_path, capsys):
    book = tmp_path / "ledger.json"
    results = tmp_path / "gpu-2026-11-28.json"
    name = ledger.case_names("suite")[0]
    for status in ("train failed (exit 1)", "ok"):
        results.write_text(json.dumps(_result(name, status=status)))
        assert ledger.main(["--ledger", str(book), "record", str(results), "--commit", "abc1234"]) == 0
    (entry,) = json.loads(book.read_text())["entries"]
    assert (entry["case"], entry["status"], entry["commit"], entry["figures"]) == \
        (name, "ok", "abc1234", {"tokens_per_s": 1000.0})
    assert ledger.main(["--ledger", str(book), "next", "--gpu", "H100-80GB", "--names"]) == 0
    assert capsys.readouterr().out.split()[-1] == name


@pytest.mark.parametrize("kind", ledger.KINDS)
def test_the_checked_in_ledger_names_real_cases(kind):
    names = set(ledger.case_names(kind))
    assert {e["case"] for e in ledger.load()["entries"] if e["kind"] == kind} <= names
