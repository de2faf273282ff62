"""Shared stage-runner machinery: trainer arguments from recipe + plan, the backend merge point (light imports:
tests/commands/test_stage_base.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.outputs.run_dir import RunDir
from recipeforge.stages import RUNNERS, runner_class
from recipeforge.stages.base import DistInfo, StageContext, TrainerStage

TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def _stage(tmp_path, *overrides, backend_kwargs=None, has_eval=False):
    from recipeforge.plan import make_plan

    loaded = load_recipe(TINY / "sft-full.yaml", overrides=list(overrides))
    ctx = StageContext(loaded=loaded, plan=make_plan(loaded.recipe), run=RunDir(tmp_path / "run"),
                       backend_kwargs=backend_kwargs or {})
    stage = TrainerStage(ctx)
    from recipeforge.components.prepared import PreparedData

    stage.data = PreparedData(train=[], eval=[] if has_eval else None)
    from recipeforge.components.kernels import apply_kernels

    stage.kernels = apply_kernels(loaded.recipe.kernels, ctx.plan.device)
    return stage


def test_dist_info_from_launcher_variables():
    assert DistInfo.from_env({}) == DistInfo(0, 0, 1)
    info = DistInfo.from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert (info.rank, info.local_rank, info.world_size, info.is_main) == (3, 1, 4, False)


def test_runner_classes():
    assert set(RUNNERS) == {"pretrain", "sft", "dpo", "grpo", "orpo", "kto", "cpo", "reward", "distill", "rloo"}
    assert runner_class("sft").stage == "sft" and runner_class("pretrain").stage == "pretrain"
    assert runner_class("distill").stage == "distill"


def test_cpu_arguments_follow_recipe_and_plan(tmp_path):
    from transformers import TrainingArguments

    stage = _stage(tmp_path, "train.optimizer=adamw", "train.scheduler=cosine_with_min_lr", "train.max_grad_norm=null",
                   "train.warmup_steps=3", "data.shuffle=false", has_eval=True)
    args = stage.training_arguments(TrainingArguments)
    plan = stage.ctx.plan
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.per_device_train_batch_size == plan.micro_batch_size == 8
    assert args.gradient_accumulation_steps == plan.gradient_accumulation
    assert args.optim == "adamw_torch" and args.lr_scheduler_type == "cosine_with_min_lr"
    assert args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert args.max_grad_norm == 0.0 and args.warmup_steps == 3
    assert args.max_steps == 80 and args.learning_rate == pytest.approx(3e-3)
    assert args.eval_strategy == "steps" and args.eval_steps == 40 and args.save_steps == 40
    assert args.output_dir == str(tmp_path / "run" / "checkpoints")
    assert args.train_sampling_strategy == "sequential"
    assert args.report_to == [] or args.report_to == "none" or args.report_to == ["none"]


def test_backend_arguments_are_merged_last(tmp_path):
    from transformers import TrainingArguments

    stage = _stage(tmp_path, backend_kwargs={"logging_steps": 7, "ddp_timeout": 99})
    args = stage.training_arguments(TrainingArguments, logging_steps=3)
    assert args.logging_steps == 7 and args.ddp_timeout == 99


def test_no_eval_data_means_no_evaluation(tmp_path):
    from transformers import TrainingArguments

    assert _stage(tmp_path, has_eval=False).training_arguments(TrainingArguments).eval_strategy == "no"
