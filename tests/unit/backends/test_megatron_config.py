"""The Megatron-Bridge translation of a recipe and plan: a pure function, tested without Megatron."""

from __future__ import annotations

import sys

import pytest

from recipeforge.backends.megatron_config import ALL_LINEAR, megatron_config
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan

# Field names of the Megatron-Bridge / Megatron-Core dataclasses each section fills (from their sources:
# megatron/bridge/training/config.py, megatron/core/optimizer/optimizer_config.py, peft/lora.py, ...).
FIELDS = {
    "model": {"tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
              "sequence_parallel", "recompute_granularity", "recompute_method", "recompute_num_layers",
              "seq_length", "bf16", "fp16", "params_dtype", "pipeline_dtype"},
    "train": {"train_iters", "global_batch_size", "micro_batch_size"},
    "validation": {"eval_interval", "eval_iters"},
    "optimizer": {"optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "bf16",
                  "fp16", "use_distributed_optimizer", "optimizer_cpu_offload", "optimizer_offload_fraction",
                  "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d", "clip_grad"},
    "scheduler": {"lr_decay_style", "lr_warmup_iters", "lr_warmup_init", "lr_decay_iters",
                  "override_opt_param_scheduler", "start_weight_decay", "end_weight_decay", "weight_decay_incr_style"},
    "ddp": {"use_distributed_optimizer", "grad_reduce_in_fp32", "check_for_nan_in_grad", "overlap_grad_reduce",
            "overlap_param_gather", "average_in_collective"},
    "checkpoint": {"save", "load", "save_interval", "ckpt_format", "fully_parallel_save", "pretrained_checkpoint"},
    "logger": {"log_interval", "tensorboard_dir"},
    "tokenizer": {"tokenizer_type", "tokenizer_model"},
    "rng": {"seed"},
    "peft": {"target_modules", "dim", "alpha", "dropout", "dropout_position", "lora_A_init_method",
             "lora_B_init_method"},
}


@pytest.fixture
def pretrain_405b(load):
    loaded = load("pretrain-llama3-405b")
    return loaded.recipe, make_plan(loaded.recipe)


def test_pretraining_405b_on_64_gpus(pretrain_405b, tmp_path):
    recipe, plan = pretrain_405b
    assert plan.backend == "megatron"
    cfg = megatron_config(plan, recipe, run_dir=tmp_path, data={"kind": "pretrain", "prefix": tmp_path / "d"},
                          train_iters=1000)
    for section, names in FIELDS.items():
        if cfg.get(section) is not None:
            assert set(cfg[section]) <= names, (section, set(cfg[section]) - names)
    m, t = cfg["model"], cfg["train"]
    assert m["tensor_model_parallel_size"] == plan.tensor_parallel and m["pipeline_model_parallel_size"] == plan.pipeline_parallel
    assert plan.tensor_parallel * plan.pipeline_parallel * plan.data_parallel == plan.world_size
    assert m["sequence_parallel"] == (plan.tensor_parallel > 1) and m["seq_length"] == recipe.data.sequence_len
    assert (t["global_batch_size"], t["micro_batch_size"], t["train_iters"]) == \
        (recipe.train.global_batch_size, plan.micro_batch_size, 1000)
    assert cfg["optimizer"]["use_distributed_optimizer"] and cfg["ddp"]["use_distributed_optimizer"]
    assert cfg["optimizer"]["optimizer_cpu_offload"] == (plan.offload != "none")
    assert cfg["optimizer"]["lr"] == recipe.train.learning_rate and cfg["optimizer"]["bf16"] is True
    assert cfg["mixed_precision"] == "bf16_mixed" and cfg["model"]["params_dtype"] == "bfloat16"
    assert cfg["dataset"] == {"kind": "gpt", "blend": [[str(tmp_path / "d")], None], "seq_length": recipe.data.sequence_len,
                              "random_seed": recipe.train.seed, "split": "1,0,0", "reset_position_ids": True,
                              "reset_attention_mask": True, "eod_mask_loss": False, "dataloader_type": "single",
                              "num_dataset_builder_threads": 1}
    assert cfg["checkpoint"]["save"] == str(tmp_path / "checkpoints")
    assert cfg["peft"] is None
    assert "megatron" not in sys.modules  # pure: nothing of Megatron was imported


def test_sft_with_lora_maps_the_target_modules(load, tmp_path):
    loaded = load("llama3-8b-full-sft", "distributed.backend=megatron", "adapter.type=lora",
                  "adapter.target_modules=[q_proj,v_proj,down_proj]", "adapter.r=8", "adapter.alpha=16")
    plan = make_plan(loaded.recipe)
    cfg = megatron_config(plan, loaded.recipe, run_dir=tmp_path, data={"kind": "sft", "root": tmp_path / "d"},
                          train_iters=10)
    assert cfg["peft"]["target_modules"] == ["linear_qkv", "linear_fc2"]
    assert (cfg["peft"]["dim"], cfg["peft"]["alpha"]) == (8, 16)
    assert cfg["dataset"]["kind"] == "sft" and cfg["dataset"]["dataset_root"] == str(tmp_path / "d")
    all_linear = megatron_config(plan, load("llama3-8b-full-sft", "distributed.backend=megatron",
                                            "adapter.type=lora").recipe,
                                 run_dir=tmp_path, data={"kind": "sft", "root": tmp_path}, train_iters=1)
    assert all_linear["peft"]["target_modules"] == ALL_LINEAR


def test_translation_refuses_what_megatron_cannot_do(load, tmp_path):
    loaded = load("llama3-8b-full-sft", "distributed.backend=megatron", "adapter.type=lora",
                  "adapter.target_modules=[embed_tokens]")
    plan = make_plan(loaded.recipe)
    with pytest.raises(RecipeError, match="no Megatron-Core counterpart"):
        megatron_config(plan, loaded.recipe, run_dir=tmp_path, data={"kind": "sft", "root": tmp_path}, train_iters=1)
    tiny = load("tiny/sft-full")
    with pytest.raises(RecipeError, match="uses backend single, not megatron"):
        megatron_config(make_plan(tiny.recipe), tiny.recipe, run_dir=tmp_path, data={}, train_iters=1)
