"""Which checkpoints count as complete, and which one a run resumes from."""

from __future__ import annotations

import json

import pytest

from recipeforge.errors import RecipeError
from recipeforge.outputs import checkpoint as ck
from recipeforge.outputs.atomic import write_marker


def _ckpt(root, step, *, state=True, weights=True, marker=False):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    if state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights:
        (d / "model.safetensors").write_bytes(b"x")
    if marker:
        write_marker(d, step)
    return d


def test_completeness_needs_the_marker(tmp_path):
    # Only a published checkpoint (marker written last, atomically) counts for `resume: auto`.
    assert ck.is_complete(_ckpt(tmp_path, 1, marker=True))
    assert not ck.is_complete(_ckpt(tmp_path, 2))  # all files there, but the save was never confirmed
    # A checkpoint written by another tool can still be named explicitly.
    assert ck.looks_complete(tmp_path / "checkpoint-2")
    assert not ck.looks_complete(_ckpt(tmp_path, 3, state=False))
    assert not ck.looks_complete(_ckpt(tmp_path, 4, weights=False))
    broken = _ckpt(tmp_path, 5)
    (broken / "trainer_state.json").write_text('{"global_st')
    assert not ck.looks_complete(broken)


def test_newest_complete_orders_by_step_not_name(tmp_path):
    _ckpt(tmp_path, 9, marker=True)
    _ckpt(tmp_path, 10, marker=True)
    _ckpt(tmp_path, 11)
    (tmp_path / ".staging" / "checkpoint-12").mkdir(parents=True)
    (tmp_path / "not-a-checkpoint").mkdir()
    assert [p.name for p in ck.checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-11"]
    assert ck.newest_complete(tmp_path).name == "checkpoint-10"
    assert [p.name for p in ck.remove_incomplete(tmp_path)] == [".staging", "checkpoint-11"]
    assert not (tmp_path / "checkpoint-11").exists() and not (tmp_path / ".staging").exists()


def test_resume_choices(tmp_path):
    assert ck.resume_checkpoint("auto", tmp_path) is None  # nothing yet: fresh start
    good = _ckpt(tmp_path, 4, marker=True)
    assert ck.resume_checkpoint("auto", tmp_path) == good
    assert ck.resume_checkpoint("never", tmp_path) is None
    assert ck.resume_checkpoint(str(good), tmp_path / "elsewhere") == good
    with pytest.raises(RecipeError, match="not a complete checkpoint") as info:
        ck.resume_checkpoint(str(tmp_path / "checkpoint-99"), tmp_path)
    assert info.value.problems[0].key == "output.resume"
    assert ck.step_of(good) == 4


def test_rotation_keeps_the_newest_and_the_best(tmp_path):
    from recipeforge.outputs.atomic import rotate

    for step in (1, 2, 3, 4):
        _ckpt(tmp_path, step, marker=True)
    _ckpt(tmp_path, 5)  # unconfirmed: not counted, not touched by rotation
    removed = rotate(tmp_path, 2, keep=tmp_path / "checkpoint-1")
    assert [p.name for p in removed] == ["checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in ck.checkpoints(tmp_path)) == ["checkpoint-1", "checkpoint-4", "checkpoint-5"]


def test_marker_is_written_atomically(tmp_path):
    from recipeforge.outputs.atomic import write_marker

    write_marker(tmp_path, 7)
    assert json.loads((tmp_path / ck.MARKER).read_text()) == {"step": 7}
    assert not list(tmp_path.glob("*.tmp"))
