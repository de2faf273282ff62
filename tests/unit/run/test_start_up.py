"""The start-up of a process kept out of the garbage collector's way (`recipeforge.start_up`): paused only by
a process's own entry, back on (its start-up objects frozen) once the libraries are imported, and left
alone where the entry did not pause it (a program calling recipeforge's functions, this test process)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from recipeforge import start_up

RECIPE = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny" / "sft-full.yaml"


@pytest.fixture
def collector():
    """Whatever a test does to the collector is undone (its frozen objects back in the oldest generation)."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    start_up._paused = False
    (gc.enable if was else gc.disable)()


def test_resume_without_pause_changes_nothing(collector):
    frozen = gc.get_freeze_count()
    start_up.resume("json")
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_pause_then_resume_imports_freezes_and_turns_the_collector_back_on(collector, monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    start_up.pause()
    assert not gc.isenabled()
    start_up.resume("colorsys", "a_module_that_is_not_installed")  # a missing one is left to its user
    assert gc.isenabled() and "colorsys" in sys.modules
    assert gc.get_freeze_count() > 10_000  # pytest's own objects and the modules imported so far
    start_up.resume("json")  # once only
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off(collector):
    gc.disable()
    start_up.pause()
    start_up.resume()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("as_typed", [True, False])
def test_train_pauses_it_only_as_the_process_itself(collector, monkeypatch, tmp_path, capsys, as_typed):
    """`recipeforge train` (no argv: the process's own command line) pauses the collector; `main(argv)`,
    called by a program, does not. A dry run stops before anything is imported that would resume it."""
    from recipeforge.cli import main

    args = ["train", str(RECIPE), f"output.dir={tmp_path / 'run'}", "--dry-run"]
    monkeypatch.setattr(sys, "argv", ["recipeforge", *args])
    assert main(None if as_typed else args) == 0
    assert "# plan:" in capsys.readouterr().out
    assert gc.isenabled() is not as_typed
