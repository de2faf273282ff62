"""Which checkpoints count as complete, and which one a run resumes from."""

from __future__ import annotations

import json

import pytest

from recipeforge.errors import RecipeError
from recipeforge.outputs import checkpoint as ck


def _ckpt(root, step, *, state=True, weights=True, marker=False):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    if state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if weights:
        (d / "model.safetensors").write_bytes(b"x")
    if marker:
        ck.mark_complete(d, step)
    return d


def test_completeness(tmp_path):
    assert ck.is_complete(_ckpt(tmp_path, 1))
    assert ck.is_complete(_ckpt(tmp_path, 2, state=False, weights=False, marker=True))
    assert not ck.is_complete(_ckpt(tmp_path, 3, state=False))
    assert not ck.is_complete(_ckpt(tmp_path, 4, weights=False))
    broken = _ckpt(tmp_path, 5)
    (broken / "trainer_state.json").write_text('{"global_st')
    assert not ck.is_complete(broken)


def test_newest_complete_orders_by_step_not_name(tmp_path):
    _ckpt(tmp_path, 9)
    _ckpt(tmp_path, 10)
    _ckpt(tmp_path, 11, weights=False)
    (tmp_path / "not-a-checkpoint").mkdir()
    assert [p.name for p in ck.checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-11"]
    assert ck.newest_complete(tmp_path).name == "checkpoint-10"
    assert [p.name for p in ck.remove_incomplete(tmp_path)] == ["checkpoint-11"]
    assert not (tmp_path / "checkpoint-11").exists()


def test_resume_choices(tmp_path):
    assert ck.resume_checkpoint("auto", tmp_path) is None  # nothing yet: fresh start
    good = _ckpt(tmp_path, 4)
    assert ck.resume_checkpoint("auto", tmp_path) == good
    assert ck.resume_checkpoint("never", tmp_path) is None
    assert ck.resume_checkpoint(str(good), tmp_path / "elsewhere") == good
    with pytest.raises(RecipeError, match="not a complete checkpoint") as info:
        ck.resume_checkpoint(str(tmp_path / "checkpoint-99"), tmp_path)
    assert info.value.problems[0].key == "output.resume"
    assert ck.step_of(good) == 4
