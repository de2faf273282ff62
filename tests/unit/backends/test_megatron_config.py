"""The Megatron-Bridge translation of a recipe and plan: a pure function, tested without Megatron."""

from __future__ import annotations

import sys

import pytest

from recipeforge.backends.megatron_config import ALL_LINEAR, megatron_config
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan

def _data(tmp_path, validation=False) -> dict:
    """What `components.megatron_data.write_megatron_data` returns (paths are not read here)."""
    data = {"root": str(tmp_path / "d"), "metadata": str(tmp_path / "d" / "pack_metadata.json"),
            "training": {"parquet": str(tmp_path / "d" / "training.idx.parquet"), "rows": 100}}
    if validation:
        data["validation"] = {"parquet": str(tmp_path / "d" / "validation.idx.parquet"), "rows": 10}
    return data


@pytest.fixture
def pretrain_405b(load):
    loaded = load("pretrain-llama3-405b")
    return loaded.recipe, make_plan(loaded.recipe)


def test_pretraining_405b_on_64_gpus(pretrain_405b, tmp_path):
    recipe, plan = pretrain_405b
    assert plan.backend == "megatron"
    cfg = megatron_config(plan, recipe, run_dir=tmp_path, data=_data(tmp_path), train_iters=1000,
                          base_checkpoint=tmp_path / "base")
    m, t = cfg["model"], cfg["train"]
    assert m["tensor_model_parallel_size"] == plan.tensor_parallel and m["pipeline_model_parallel_size"] == plan.pipeline_parallel
    assert plan.tensor_parallel * plan.pipeline_parallel * plan.data_parallel == plan.world_size
    assert m["sequence_parallel"] == (plan.tensor_parallel > 1) and m["seq_length"] == recipe.data.sequence_len
    # packed rows go one per micro batch, and the plan says so
    assert (t["global_batch_size"], t["micro_batch_size"], t["train_iters"]) == \
        (recipe.train.global_batch_size, plan.micro_batch_size, 1000) == (recipe.train.global_batch_size, 1, 1000)
    assert cfg["optimizer"]["use_distributed_optimizer"] and cfg["ddp"]["use_distributed_optimizer"]
    assert cfg["optimizer"]["optimizer_cpu_offload"] == (plan.offload != "none")
    assert cfg["optimizer"]["lr"] == recipe.train.learning_rate and cfg["optimizer"]["bf16"] is True
    assert cfg["mixed_precision"] == "bf16_mixed" and cfg["model"]["params_dtype"] == "bfloat16"
    seq = recipe.data.sequence_len
    assert cfg["dataset"] == {
        "kind": "sft", "seq_length": seq, "dataset_root": str(tmp_path / "d"), "seed": recipe.train.seed,
        "max_train_samples": 1000 * recipe.train.global_batch_size, "enable_offline_packing": True,
        "offline_packing_specs": {"packed_sequence_size": seq,
                                  "packed_train_data_path": str(tmp_path / "d" / "training.idx.parquet"),
                                  "packed_val_data_path": None,
                                  "packed_metadata_path": str(tmp_path / "d" / "pack_metadata.json")},
        "dataset_kwargs": {"answer_only_loss": True}, "do_validation": False, "do_test": False,
        "dataloader_type": "batch"}
    assert cfg["validation"]["eval_iters"] == 0
    ck = cfg["checkpoint"]
    assert (ck["save"], ck["load"], ck["pretrained_checkpoint"]) == \
        (str(tmp_path / "checkpoints"), str(tmp_path / "checkpoints"), str(tmp_path / "base"))
    assert ck["most_recent_k"] == recipe.output.save_total_limit
    assert cfg["optimizer"]["optimizer"] == "adam" and cfg["optimizer"]["decoupled_weight_decay"] is True
    assert cfg["dist"]["distributed_timeout_minutes"] == round(recipe.distributed.timeout_minutes)
    assert cfg["peft"] is None
    assert "megatron" not in sys.modules  # pure: nothing of Megatron was imported


def test_sft_with_lora_maps_the_target_modules(load, tmp_path):
    loaded = load("llama3-8b-full-sft", "distributed.backend=megatron", "adapter.type=lora",
                  "adapter.target_modules=[q_proj,v_proj,down_proj]", "adapter.r=8", "adapter.alpha=16")
    plan = make_plan(loaded.recipe)
    cfg = megatron_config(plan, loaded.recipe, run_dir=tmp_path, data=_data(tmp_path, validation=True),
                          train_iters=10)
    assert cfg["peft"]["target_modules"] == ["linear_qkv", "linear_fc2"]
    assert (cfg["peft"]["dim"], cfg["peft"]["alpha"]) == (8, 16)
    assert cfg["dataset"]["kind"] == "sft" and cfg["dataset"]["dataset_root"] == str(tmp_path / "d")
    assert cfg["dataset"]["do_validation"] is True
    assert cfg["validation"]["eval_iters"] == -(-10 // plan.global_batch_size)  # the whole validation split
    all_linear = megatron_config(plan, load("llama3-8b-full-sft", "distributed.backend=megatron",
                                            "adapter.type=lora").recipe,
                                 run_dir=tmp_path, data=_data(tmp_path), train_iters=1)
    assert all_linear["peft"]["target_modules"] == ALL_LINEAR


def test_translation_refuses_what_megatron_cannot_do(load, tmp_path):
    loaded = load("llama3-8b-full-sft", "distributed.backend=megatron", "adapter.type=lora",
                  "adapter.target_modules=[embed_tokens]")
    plan = make_plan(loaded.recipe)
    with pytest.raises(RecipeError, match="no Megatron-Core counterpart"):
        megatron_config(plan, loaded.recipe, run_dir=tmp_path, data=_data(tmp_path), train_iters=1)
    tiny = load("tiny/sft-full")
    with pytest.raises(RecipeError, match="uses backend single, not megatron"):
        megatron_config(make_plan(tiny.recipe), tiny.recipe, run_dir=tmp_path, data=_data(tmp_path), train_iters=1)


@pytest.mark.parametrize("overrides,expected", [
    ((), {"optimizer": "adam", "decoupled_weight_decay": True, "adam_beta1": 0.9, "adam_beta2": 0.95,
          "adam_eps": 1e-8}),
    (("train.optimizer=sgd", "distributed.offload=none"), {"optimizer": "sgd", "sgd_momentum": 0.0}),
])
def test_the_recipe_optimizer_is_the_one_megatron_runs(load, tmp_path, overrides, expected):
    loaded = load("pretrain-llama3-405b", "train.adam_beta2=0.95", *overrides)
    cfg = megatron_config(make_plan(loaded.recipe), loaded.recipe, run_dir=tmp_path, data=_data(tmp_path),
                          train_iters=1)
    assert {k: cfg["optimizer"][k] for k in expected} == expected
    assert ("adam_eps" in cfg["optimizer"]) == (expected["optimizer"] == "adam")


def test_resume_never_and_trackers_reach_megatron(load, tmp_path):
    loaded = load("pretrain-llama3-405b", "output.resume=never", "output.save_total_limit=2",
                  "logging.wandb.project=p", "logging.wandb.name=n", "logging.mlflow.experiment=e")
    cfg = megatron_config(make_plan(loaded.recipe), loaded.recipe, run_dir=tmp_path, data=_data(tmp_path),
                          train_iters=1)
    assert cfg["checkpoint"]["load"] is None and cfg["checkpoint"]["most_recent_k"] == 2
    lg = cfg["logger"]
    assert (lg["wandb_project"], lg["wandb_exp_name"], lg["mlflow_experiment"]) == ("p", "n", "e")


@pytest.mark.parametrize("overrides, nan, spike", [((), True, False),
                                                   (("train.divergence.stop_on_nan=false",), False, False)])
def test_megatron_stops_on_signals_and_divergence_like_the_other_backends(load, tmp_path, overrides, nan, spike):
    """SIGTERM: Megatron's own handler saves and leaves its loop (the stage then reports the stop);
    the loss is checked for NaN as the recipe says; Megatron's own spike check (not the recipe's) stays off."""
    loaded = load("pretrain-llama3-405b", *overrides)
    cfg = megatron_config(make_plan(loaded.recipe), loaded.recipe, run_dir=tmp_path, data=_data(tmp_path),
                          train_iters=10)
    assert cfg["train"]["exit_signal_handler"] is True
    assert cfg["rerun_state_machine"] == {"check_for_nan_in_loss": nan, "check_for_spiky_loss": spike}


def test_a_loop_left_before_its_last_iteration_is_a_stop(tmp_path):
    from recipeforge.stages.megatron_lm import last_saved_iteration

    assert last_saved_iteration(tmp_path) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40\n")
    assert last_saved_iteration(tmp_path) == 40
