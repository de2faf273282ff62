"""A run stopped after a checkpoint and resumed with `resume: auto` ends where an uninterrupted one does."""

from __future__ import annotations

import shutil

import pytest

from recipeforge.outputs import checkpoint

pytestmark = pytest.mark.slow


class Crash(Exception):
    """Stands in for a killed process."""


@pytest.fixture
def crash_at_step(monkeypatch):
    """Make the next run die (an exception out of the training loop) right after step `n`."""
    from transformers import TrainerCallback

    from recipeforge.stages.base import TrainerStage

    def arm(n: int):
        class CrashAt(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == n:
                    raise Crash(n)

        original = TrainerStage.callbacks
        monkeypatch.setattr(TrainerStage, "callbacks", lambda self: original(self) + [CrashAt()])
        return lambda: monkeypatch.setattr(TrainerStage, "callbacks", original)

    return arm


@pytest.mark.parametrize("recipe", ["sft-lora", "pretrain"])
def test_resume_reaches_the_same_final_loss(tiny, tmp_path, crash_at_step, recipe):
    overrides = ("train.max_steps=30", "output.save_steps=10", "train.logging_steps=1", "data.val_size=0",
                 "output.merge_adapter=false")
    whole = tiny.train(recipe, tmp_path / "whole", *overrides)

    disarm = crash_at_step(25)
    with pytest.raises(Crash):
        tiny.train(recipe, tmp_path / "broken", *overrides)
    disarm()
    broken = tmp_path / "broken"
    assert not (broken / "final").exists()
    assert checkpoint.newest_complete(broken / "checkpoints").name == "checkpoint-20"
    # A checkpoint half written when the process died must be ignored, and cleaned away.
    partial = broken / "checkpoints" / "checkpoint-25"
    shutil.copytree(broken / "checkpoints" / "checkpoint-20", partial)
    (partial / "trainer_state.json").write_text('{"global_step": 2')
    (partial / checkpoint.MARKER).unlink()

    resumed = tiny.train(recipe, broken, *overrides, overwrite=False)  # resume: auto (the default)
    assert not partial.exists()
    loss_whole, loss_resumed = tiny.values(whole, "loss"), tiny.values(resumed, "loss")
    steps = [r["step"] for r in tiny.records(resumed, "train") if "loss" in r]
    assert steps == list(range(1, 31))  # steps 21-25 of the broken run were replaced, not duplicated
    assert loss_resumed[-1] == pytest.approx(loss_whole[-1], rel=1e-5, abs=1e-6)
    assert loss_resumed[20:] == pytest.approx(loss_whole[20:], rel=1e-5, abs=1e-6)


def test_resume_never_refuses_an_existing_run(tiny, tmp_path):
    from recipeforge.errors import RecipeError

    run = tiny.train("pretrain", tmp_path / "run", "train.max_steps=2", "output.save_steps=1", "data.val_size=0")
    shutil.rmtree(run / "final")  # an interrupted run: checkpoints, no final model
    with pytest.raises(RecipeError, match="resume is 'never'"):
        tiny.train("pretrain", run, "train.max_steps=2", "output.save_steps=1", "data.val_size=0",
                   "output.resume=never", overwrite=False)
