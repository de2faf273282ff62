"""`train.activation_offloading`: TRL's offloading of saved activations to pinned host memory.

On the CPU it is refused (TRL moves tensors off an accelerator only); on GPUs the pretrain/sft
runner wraps the Trainer's step in TRL's context and TRL's own trainers get their config field, and
training gives the losses of the same run without it (`gpu`-marked)."""

from __future__ import annotations

import pytest

from recipeforge.errors import RecipeError


def test_a_cpu_run_refuses_it_at_its_key(tiny, tmp_path):
    with pytest.raises(RecipeError) as err:
        tiny.train("sft-lora", tmp_path / "run", "train.activation_offloading=true", "train.max_steps=2")
    problem = err.value.problems[0]
    assert problem.key == "train.activation_offloading" and "planned for the cpu" in problem.message
    assert problem.location is not None  # the override that set it


def test_stages_without_it_are_refused_by_name():
    from recipeforge.stages.activation_offload import check_activation_offloading

    with pytest.raises(RecipeError, match="not available for the grpo stage") as err:
        check_activation_offloading("grpo", "cuda")
    assert "pretrain, sft, dpo, kto, reward" in err.value.problems[0].hint
    check_activation_offloading("dpo", "cuda")  # runs


def test_trl_configs_get_their_own_field_and_the_plain_trainer_does_not():
    from transformers import TrainingArguments
    from trl import DPOConfig, SFTConfig

    from recipeforge.stages.activation_offload import trainer_field

    assert trainer_field(SFTConfig) == trainer_field(DPOConfig) == {"activation_offloading": True}
    assert trainer_field(TrainingArguments) == {}


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


GPU = ("~hardware", "model.dtype=bf16", "train.max_steps=6", "train.logging_steps=1", "data.val_size=0",
       "distributed.backend=single")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["sft-lora", "dpo"])
def test_offloaded_training_gives_the_same_losses_on_a_gpu(tiny, tmp_path, recipe):
    if not _gpu():
        pytest.skip("needs a CUDA GPU")
    plain = tiny.train(recipe, tmp_path / "plain", *GPU)
    offloaded = tiny.train(recipe, tmp_path / "offloaded", *GPU, "train.activation_offloading=true")
    a, b = tiny.values(plain, "loss"), tiny.values(offloaded, "loss")
    assert len(a) == len(b) == 6 and b == pytest.approx(a, abs=2e-2), (a, b)
    assert b[-1] < b[0]


@pytest.mark.gpu
@pytest.mark.slow
def test_the_plain_trainer_steps_inside_trls_offloading_context(tiny, tmp_path):
    if not _gpu():
        pytest.skip("needs a CUDA GPU")
    from trl.models.activation_offloading import OffloadActivations

    from recipeforge.outputs.run_dir import RunDir
    from recipeforge.plan import make_plan
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import StageContext

    loaded = tiny.load("sft-lora", tmp_path / "probe", *GPU, "train.activation_offloading=true")
    runner = runner_class("sft")(StageContext(loaded=loaded, plan=make_plan(loaded.recipe), run=RunDir(tmp_path / "p")))
    runner.setup()
    assert isinstance(runner.trainer.activation_offload_context, OffloadActivations)
