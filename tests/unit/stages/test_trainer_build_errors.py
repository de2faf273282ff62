"""An error the training library raises while a stage builds its trainer (a configuration class or
the trainer's constructor refusing what it was given) is a user error naming the stage, the trainer
and the library's message; the library's exception stays attached for ``--debug``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recipeforge.errors import RecipeError
from recipeforge.stages.dpo import DPOStage
from recipeforge.stages.lm import LMStage


class _DPOWithAnOptionTRLLacks(DPOStage):
    def build_trainer(self):
        from trl import DPOConfig

        # what a recipeforge/TRL version mismatch looks like: an argument the installed TRL lacks
        return DPOConfig(output_dir=self.out, use_cpu=True, bf16=False, max_prompt_len=8)


class _LMWithInconsistentArguments(LMStage):
    stage = "sft"

    def build_trainer(self):
        from transformers import TrainingArguments

        return TrainingArguments(output_dir=self.out, use_cpu=True, eval_strategy="steps", save_strategy="epoch",
                                 load_best_model_at_end=True)


@pytest.mark.parametrize("cls, stage, trainer, error", [
    (_DPOWithAnOptionTRLLacks, "dpo", "trl.DPOTrainer", TypeError),
    (_LMWithInconsistentArguments, "sft", "transformers.Trainer", ValueError),
])
def test_library_errors_become_user_errors(tmp_path, cls, stage, trainer, error):
    runner = cls(SimpleNamespace(recipe=SimpleNamespace(stage=stage)))
    runner.out = str(tmp_path)
    with pytest.raises(RecipeError) as info:
        runner.build_trainer_explained()
    problem = info.value.problems[0]
    assert problem.message.startswith(f"building the {stage} trainer ({trainer}) failed: {error.__name__}: ")
    assert "\n" not in problem.message and problem.key == "stage"
    assert trainer.split(".")[0] in problem.hint and "--debug" in problem.hint
    assert isinstance(info.value.__cause__, error)  # the traceback --debug prints
    if error is TypeError:
        assert "max_prompt_len" in problem.message  # the library's own words
