"""Table-driven planning of realistic cases, pins, batch rules and the errors users see."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware, policy
from recipeforge.plan.hardware import Hardware

ROOT = Path(__file__).resolve().parents[3]


def plan(recipe, spec):
    return make_plan(recipe, parse_hardware(spec))


# ----------------------------------------------------------------------------- the acceptance table

def test_qlora_70b_fits_one_80gb_gpu(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-70B", adapter={"type": "qlora"}), "1xH100-80GB")
    assert (p.backend, p.world_size, p.offload) == ("single", 1, "none")
    assert p.memory_gb["total"] <= 0.9 * 79.6
    assert p.memory_gb["weights"] < 45                       # 4-bit base instead of 131 GB in bf16
    assert p.micro_batch_size * p.gradient_accumulation == 32


def test_full_finetune_8b_on_8x80_is_sharded_data_parallel(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B"), "8xH100-80GB")
    assert p.backend in ("fsdp", "deepspeed") and p.offload == "none"
    assert p.world_size == p.data_parallel == 8
    assert p.reasons["backend"].reason.count("ddp needs") == 1   # DDP was tried first and did not fit
    assert p.memory_gb["total"] <= p.extra.memory_limit_gb


def test_full_finetune_70b_on_16x80_is_zero3_or_fsdp(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-70B"), "2x8xH100-80GB")
    assert (p.backend, getattr(p.backend_part, "zero_stage", None)) in (("deepspeed", 3), ("fsdp", None))
    assert p.preset in ("zero3", "zero3_offload", "zero3_offload_params", "fsdp_full_shard", "fsdp_full_shard_offload")
    # offload only because every GPU-only layout was evaluated and does not fit
    if p.offload != "none":
        gpu_only = [r for r in p.extra.runners_up if "offload" not in (r["preset"] or "")
                    and r["backend"] != "megatron"]
        assert gpu_only and not any(r["fits"] for r in gpu_only)
    assert p.world_size == 16 and p.nodes == 2


def test_70b_on_16x141_needs_no_offload(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-70B"), "2x8xH200-141GB")
    assert p.offload == "none" and p.preset in ("fsdp_full_shard", "zero3", "fsdp_shard_grad_op", "zero2")


def test_405b_dense_pretraining_on_64x80_goes_megatron(recipe):
    r = recipe("meta-llama/Llama-3.1-405B", "pretrain", data={"sequence_len": 8192}, train={"global_batch_size": 1024})
    p = plan(r, "8x8xH100-80GB")
    assert p.backend == "megatron"
    assert p.tensor_parallel == 8 and p.pipeline_parallel > 1
    assert p.tensor_parallel * p.pipeline_parallel * p.data_parallel == 64
    assert p.global_batch_size == 1024 == p.micro_batch_size * p.gradient_accumulation * p.data_parallel


def test_tiny_models_on_cpu_are_single(recipe):
    for model in ("tiny:llama", "tiny:qwen2"):
        for stage in ("pretrain", "sft", "dpo", "grpo"):
            p = plan(recipe(model, stage, train={"global_batch_size": 8}), "cpu")
            assert (p.backend, p.device, p.world_size, p.gpus_per_node) == ("single", "cpu", 1, 0)


def test_impossible_70b_full_finetune_on_24gb(recipe):
    with pytest.raises(RecipeError) as err:
        plan(recipe("meta-llama/Llama-3.1-70B"), "1xL4-24GB")
    problem = err.value.problems[0]
    assert "does not fit on 1xL4-24GB" in problem.message
    assert "GB short" in problem.message and "needs" in problem.message
    short = float(problem.message.split(" GB short")[0].rsplit("(", 1)[1])
    assert short > 400  # a 70B full fine-tune misses a 24 GB GPU by hundreds of GB
    hint = problem.hint
    assert "qlora" in hint                       # an adapter
    assert "xL4-24GB" in hint                    # more of the same GPU
    assert "offload" in hint and "host RAM" in hint


# ----------------------------------------------------------------------------- batch sizes

def test_int_micro_batch_is_used_and_accumulation_derived(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", adapter={"type": "lora"},
                    train={"micro_batch_size": 2, "global_batch_size": 64}), "4xA100-80GB")
    assert p.micro_batch_size == 2 and p.gradient_accumulation == 64 // (2 * p.data_parallel)
    assert p.reasons["micro_batch_size"].reason == "recipe sets it"


def test_indivisible_batch_is_an_error(recipe):
    with pytest.raises(RecipeError) as err:
        plan(recipe("meta-llama/Llama-3.1-8B", adapter={"type": "lora"},
                    train={"micro_batch_size": 3, "global_batch_size": 32}), "4xA100-80GB")
    problem = err.value.problems[0]
    assert problem.key == "train.micro_batch_size" and "not a multiple" in problem.message
    assert "multiple of 12" in problem.hint


def test_global_batch_not_divisible_by_ranks(recipe):
    with pytest.raises(RecipeError) as err:
        plan(recipe("meta-llama/Llama-3.1-8B", adapter={"type": "lora"}, train={"global_batch_size": 30}),
             "8xA100-80GB")
    assert err.value.problems[0].key == "train.global_batch_size"


def test_auto_micro_batch_divides_the_per_rank_batch(recipe):
    for global_batch in (8, 12, 24, 96):
        p = plan(recipe("Qwen/Qwen2.5-0.5B", train={"global_batch_size": global_batch}), "2xA100-80GB")
        per_rank = global_batch // p.data_parallel
        assert per_rank % p.micro_batch_size == 0 and p.micro_batch_size <= 8
        assert p.micro_batch_size * p.gradient_accumulation * p.data_parallel == global_batch


def test_auto_checkpointing_turns_on_only_when_needed(recipe):
    short = plan(recipe("Qwen/Qwen2.5-0.5B", data={"sequence_len": 512}), "1xH100-80GB")
    assert not short.gradient_checkpointing
    long = plan(recipe("meta-llama/Llama-3.1-8B", adapter={"type": "lora"}, data={"sequence_len": 16384}),
                "1xH100-80GB")
    assert long.gradient_checkpointing and "without it" in long.reasons["gradient_checkpointing"].reason


# ----------------------------------------------------------------------------- pins

def test_pinned_backend_wins(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "deepspeed", "zero_stage": 3}),
             "8xH100-80GB")
    assert (p.backend, p.backend_part.zero_stage, p.preset) == ("deepspeed", 3, "zero3")
    assert "recipe pins" in p.reasons["backend"].reason


def test_pinned_layout_that_does_not_fit(recipe):
    with pytest.raises(RecipeError) as err:
        plan(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "ddp"}, data={"sequence_len": 16384}),
             "8xH100-80GB")
    problem = err.value.problems[0]
    assert problem.message.startswith("pinned backend: ddp") and "GB short" in problem.message
    assert "auto would choose" in problem.hint


def test_pinned_megatron_sizes(recipe):
    r = recipe("meta-llama/Llama-3.1-8B", "pretrain",
               distributed={"backend": "megatron", "tensor_parallel": 2, "pipeline_parallel": 2})
    p = plan(r, "8xH100-80GB")
    assert (p.tensor_parallel, p.pipeline_parallel, p.data_parallel) == (2, 2, 2)


def test_pinned_megatron_for_dpo_is_rejected(recipe):
    with pytest.raises(RecipeError, match="pretrain and sft only"):
        plan(recipe("meta-llama/Llama-3.1-8B", "dpo", distributed={"backend": "megatron"}), "8xH100-80GB")


def test_pinned_offload(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", distributed={"offload": "optimizer+params"}), "8xH100-80GB")
    assert p.offload == "optimizer+params" and p.extra.cpu_memory_gb > 0


def test_unknown_preset(recipe):
    with pytest.raises(RecipeError) as err:
        plan(recipe("meta-llama/Llama-3.1-8B", distributed={"preset": "zero3_ofload"}), "8xH100-80GB")
    assert "did you mean 'zero3_offload'" in err.value.problems[0].hint


def test_missing_package_is_a_warning_with_the_extra(recipe, monkeypatch):
    monkeypatch.setattr(policy, "backend_installed", lambda caps: caps.name != "deepspeed")
    p = plan(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "deepspeed"}), "8xH100-80GB")
    assert any("pip install 'recipeforge[deepspeed]'" in w for w in p.extra.warnings)


def test_auto_passes_over_a_missing_package_on_this_machine(recipe, monkeypatch):
    here = replace(parse_hardware("2x8xH100-80GB"), source="probe", cpu_ram_gb=2048.0)
    with_deepspeed = make_plan(recipe("meta-llama/Llama-3.1-70B"), here)
    monkeypatch.setattr(policy, "backend_installed", lambda caps: caps.name != "deepspeed")
    p = make_plan(recipe("meta-llama/Llama-3.1-70B"), here)
    assert with_deepspeed.backend == "deepspeed" and p.backend == "fsdp"
    # a target described by a spec keeps the preferred layout, with a warning
    remote = plan(recipe("meta-llama/Llama-3.1-70B"), "2x8xH100-80GB")
    assert remote.backend == "deepspeed" and any("recipeforge[deepspeed]" in w for w in remote.extra.warnings)
    passed_over = [r for r in p.extra.runners_up if r["preset"] == with_deepspeed.preset]
    assert "not installed" in passed_over[0]["why"] and "recipeforge[deepspeed]" in passed_over[0]["why"]


def test_pins_on_cpu(recipe):
    assert plan(recipe("tiny:llama", distributed={"backend": "ddp"}), "cpu").backend == "ddp"
    ds = plan(recipe("tiny:llama", distributed={"backend": "deepspeed"}), "cpu")
    assert (ds.backend, ds.backend_part.zero_stage, ds.preset) == ("deepspeed", 2, "zero2")  # ZeRO over gloo
    fsdp = plan(recipe("tiny:llama", distributed={"backend": "fsdp"}), "cpu")  # FSDP2 over gloo
    assert (fsdp.backend, fsdp.preset, fsdp.backend_part.sharding) == ("fsdp", "fsdp_full_shard", "full_shard")
    with pytest.raises(RecipeError, match="needs CUDA GPUs"):
        plan(recipe("tiny:llama", distributed={"backend": "megatron"}), "cpu")


# ----------------------------------------------------------------------------- stages and hardware

def test_grpo_colocated_vllm_reserves_its_share(recipe):
    r = recipe("Qwen/Qwen2.5-7B", "grpo", grpo={"rollout": {"engine": "vllm", "gpu_memory_utilization": 0.4}},
               train={"global_batch_size": 64})
    p = plan(r, "8xH100-80GB")
    assert p.memory_gb["rollout_engine"] == pytest.approx(0.4 * 79.6, rel=0.01)


def test_dpo_full_finetune_holds_a_reference_model(recipe):
    p = plan(recipe("Qwen/Qwen2.5-0.5B", "dpo"), "1xH100-80GB")
    assert p.memory_gb["reference_model"] > 0.9
    p = plan(recipe("Qwen/Qwen2.5-0.5B", "dpo", adapter={"type": "lora"}), "1xH100-80GB")
    assert "reference_model" not in p.memory_gb


def test_moe_model_plans(recipe):
    # LoRA over a sharded bf16 base: transformers 5 keeps routed experts as fused parameters, which a
    # 4-bit QLoRA base does not quantize, so QLoRA would not save the memory it saves on dense models
    p = plan(recipe("mistralai/Mixtral-8x7B-v0.1", adapter={"type": "lora"}), "2xH100-80GB")
    assert p.backend == "fsdp" and p.extra.model["active_params"] < p.extra.model["params"] / 3


def test_hardware_from_the_recipe_section(recipe):
    p = make_plan(recipe("Qwen/Qwen2.5-0.5B", hardware={"gpus_per_node": 2, "gpu": "L4-24GB"}))
    assert p.extra.hardware["spec"] == "2xL4-24GB" and p.reasons["hardware"].reason.endswith("hardware: section")


def test_fp16_on_gpus_without_bf16(recipe):
    p = plan(recipe("Qwen/Qwen2.5-0.5B"), "1xV100-32GB")
    assert p.extra.dtype == "fp16" and "lacks bf16" in p.reasons["dtype"].reason


def test_cpu_too_small_for_a_real_model(recipe):
    hw = Hardware(nodes=1, gpus_per_node=0, accelerator=None, cpu_ram_gb=16.0)
    with pytest.raises(RecipeError) as err:
        make_plan(recipe("meta-llama/Llama-3.1-8B"), hw)
    assert "does not fit on cpu" in err.value.problems[0].message


def test_plan_to_dict_is_json(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B"), "8xH100-80GB")
    data = json.loads(json.dumps(p.to_dict()))
    assert data["backend"] == p.backend and data["reasons"]["backend"]["value"] == p.backend
    assert set(data["memory_gb"]) >= {"weights", "gradients", "optimizer", "activations", "total"}
    assert data["extra"]["runners_up"]


# ----------------------------------------------------------------------------- every example recipe

EXAMPLES = sorted(p for p in (ROOT / "examples" / "yaml").rglob("*.yaml")
                  if p.parent.name != "base" and p.name != "base.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples" / "yaml")))
def test_every_example_plans_on_its_hardware(path):
    loaded = load_recipe(path)
    assert loaded.recipe.hardware is not None, "examples name the hardware they are written for"
    p = make_plan(loaded.recipe)
    assert p.memory_gb["total"] <= p.extra.memory_limit_gb
    assert p.micro_batch_size * p.gradient_accumulation * p.data_parallel == loaded.recipe.train.global_batch_size
    if path.parent.name == "tiny":
        assert (p.backend, p.device, p.world_size) == ("single", "cpu", 1)
    if "405b" in path.name:
        assert p.backend == "megatron"
