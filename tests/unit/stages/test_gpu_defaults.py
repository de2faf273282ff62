"""GPU defaults in the trainer arguments, decided on the CPU from the recipe, the plan and a compute
capability: TF32, the process-group timeout, fp32 master weights, padding multiples, torchao's AdamW."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.outputs.run_dir import RunDir
from recipeforge.stages import precision
from recipeforge.stages.base import StageContext, TrainerStage
from recipeforge.stages.precision import loads_fp32_masters, tf32_argument

SFT = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny" / "sft-full.yaml"
QWEN_1_5B = "model.name_or_path=Qwen/Qwen2.5-1.5B"


def _stage(tmp_path, hw: str | None, *overrides: str) -> TrainerStage:
    from recipeforge.components.kernels import apply_kernels
    from recipeforge.plan import make_plan, parse_hardware

    loaded = load_recipe(SFT, overrides=list(overrides))
    plan = make_plan(loaded.recipe, parse_hardware(hw) if hw else None)
    stage = TrainerStage(StageContext(loaded=loaded, plan=plan, run=RunDir(tmp_path / "run")))
    stage.kernels = apply_kernels(loaded.recipe.kernels, plan.device)
    return stage


def test_tf32_follows_the_compute_capability():
    assert tf32_argument("auto", "cuda", (8, 0)) is True and tf32_argument("auto", "cuda", (9, 0)) is True
    assert tf32_argument("auto", "cuda", (7, 0)) is None  # torch's default (off) on pre-Ampere GPUs
    assert tf32_argument(False, "cuda", (9, 0)) is False
    assert tf32_argument(True, "cpu", None) is None and tf32_argument("auto", "cpu", None) is None
    with pytest.raises(RecipeError, match="compute capability 8.0") as err:
        tf32_argument(True, "cuda", (7, 5))
    assert err.value.problems[0].key == "train.tf32"


def test_gpu_trainer_arguments(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cuda_capability", lambda: (9, 0))
    kwargs = _stage(tmp_path, "1xH100-80GB", QWEN_1_5B).common_arguments()
    assert kwargs["tf32"] is True and kwargs["ddp_timeout"] == 3600
    monkeypatch.setattr(precision, "cuda_capability", lambda: (7, 0))
    kwargs = _stage(tmp_path, "1xH100-80GB", QWEN_1_5B, "distributed.timeout_minutes=0.05").common_arguments()
    assert kwargs["tf32"] is None and kwargs["ddp_timeout"] == 3


def test_cpu_trainer_arguments_leave_tf32_alone(tmp_path):
    from transformers import TrainingArguments

    args = _stage(tmp_path, None).training_arguments(TrainingArguments)
    assert args.tf32 is None and args.ddp_timeout == 3600


def test_mixed_precision_loads_fp32_masters(tmp_path):
    mixed = _stage(tmp_path, "1xH100-80GB", QWEN_1_5B).ctx.plan
    assert precision.precision_of(mixed) == "mixed"
    assert loads_fp32_masters(mixed, "none", "torch.bfloat16")
    assert not loads_fp32_masters(mixed, "lora", "torch.bfloat16")  # peft keeps the adapter in fp32 itself
    pure = _stage(tmp_path, "1xL4-24GB", QWEN_1_5B).ctx.plan
    assert precision.precision_of(pure) == "pure_bf16" and not loads_fp32_masters(pure, "none", "torch.bfloat16")
    assert loads_fp32_masters(pure, "none", "torch.float16")  # fp16 always trains on fp32 masters
    cpu = _stage(tmp_path, None, "model.dtype=bf16").ctx.plan
    assert not loads_fp32_masters(cpu, "none", "torch.bfloat16")


def test_trl_configs_pad_to_a_multiple_of_8_on_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cuda_capability", lambda: (9, 0))

    class Config:  # a TRL config's constructor, capturing what it is given
        __dataclass_fields__ = {"pad_to_multiple_of": None}

        def __init__(self, **kwargs):
            self.kwargs = kwargs

    assert _stage(tmp_path, "1xH100-80GB", QWEN_1_5B).training_arguments(Config).kwargs["pad_to_multiple_of"] == 8
    assert _stage(tmp_path, None).training_arguments(Config).kwargs["pad_to_multiple_of"] is None


def test_pure_bf16_with_stochastic_rounding_needs_torchao(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchao", None)  # as on a machine without torchao
    stage = _stage(tmp_path, "1xH100-80GB", QWEN_1_5B, "train.precision=pure_bf16_sr")
    assert precision.precision_of(stage.ctx.plan) == "pure_bf16_sr"
    with pytest.raises(RecipeError, match="needs the torchao package") as err:
        stage.setup()  # refused before the tokenizer, data or model load
    assert err.value.problems[0].key == "train.precision" and stage.tokenizer is None
    assert precision.sr_optimizer(_stage(tmp_path, "1xH100-80GB", QWEN_1_5B).ctx.plan, None) is None


def test_pure_bf16_with_stochastic_rounding_trains_with_torchaos_adamw(tmp_path):
    from types import SimpleNamespace

    pytest.importorskip("torchao")
    stage = _stage(tmp_path, "1xH100-80GB", QWEN_1_5B, "train.precision=pure_bf16_sr", "train.learning_rate=1e-4")
    built = SimpleNamespace(optimizer_cls_and_kwargs=None)  # what build_trainer hands back, before training
    stage.build_trainer = lambda: built
    assert stage.build_trainer_explained() is built
    cls, kwargs = built.optimizer_cls_and_kwargs
    assert cls.__module__.startswith("torchao.") and "AdamW" in cls.__name__
    assert kwargs["bf16_stochastic_round"] is True and kwargs["lr"] == 1e-4
