"""What planning produces: the table and the backend artifacts (DeepSpeed reading them, and planning's
light imports: tests/commands/test_plan_output.py)."""

from __future__ import annotations

import json

import pytest

from recipeforge.errors import RecipeError
from recipeforge.backends.artifacts import deepspeed_config, fsdp_plugin_config, megatron_parallel_settings
from recipeforge.plan import make_plan, parse_hardware, render_plan


def test_render_shows_choice_memory_reasons_and_runners_up(recipe):
    p = make_plan(recipe("meta-llama/Llama-3.1-8B"), parse_hardware("8xH100-80GB"))
    text = render_plan(p)
    assert text.startswith(f"Plan: {p.backend} ({p.preset}) on 8xH100-80GB")
    assert "8.03B params" in text
    for label in ("weights", "gradients", "optimizer states", "activations", "logits + loss", "peak"):
        assert label in text
    assert f"micro {p.micro_batch_size} x accumulation {p.gradient_accumulation}" in text
    for decision in p.reasons:
        assert decision in text or decision == "memory_accuracy"  # printed under the memory table
    assert f"expected accuracy {p.reasons['memory_accuracy'].value}" in text
    assert "Runners-up:" in text and "ddp" in text.split("Runners-up:")[1]


def test_plan_states_its_accuracy_and_what_moves_the_peak_most(recipe):
    import json

    p = make_plan(recipe("meta-llama/Llama-3.1-8B", adapter={"type": "lora"}, data={"sequence_len": 8192},
                         train={"gradient_checkpointing": True}), parse_hardware("1xH100-80GB"))
    from recipeforge.plan.accuracy_bands import BANDS

    accuracy = p.reasons["memory_accuracy"]
    assert accuracy.value == f"±{BANDS['calibrated']:.0%}" and p.extra.accuracy_class == "calibrated"
    # full-vocabulary logits are the largest lever here; the saving is the model's own difference
    assert "most sensitive to: logits" in accuracy.reason and "fused_linear_cross_entropy" in accuracy.reason
    saved = float(accuracy.reason.split("saves ")[1].split(" GB")[0])
    assert 0.5 * p.memory_gb["logits"] < saved <= p.memory_gb["total"]
    assert json.loads(json.dumps(p.to_dict()))["reasons"]["memory_accuracy"]["value"] == accuracy.value
    sharded = make_plan(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "fsdp", "preset": "fsdp_full_shard"}),
                        parse_hardware("8xH100-80GB"))
    assert sharded.reasons["memory_accuracy"].value == f"±{BANDS['sharded']:.0%}"


def test_render_cpu_plan(recipe):
    text = render_plan(make_plan(recipe("tiny:llama", train={"global_batch_size": 8}), parse_hardware("cpu")))
    assert "Plan: single on cpu" in text and "Memory per process" in text and "1 (CPU)" in text


# ----------------------------------------------------------------------------- artifacts

def test_deepspeed_config_is_consistent(recipe):
    r = recipe("meta-llama/Llama-3.1-70B", distributed={"backend": "deepspeed"})
    p = make_plan(r, parse_hardware("2x8xH100-80GB"))
    cfg = deepspeed_config(p, r)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] \
        * p.data_parallel == r.train.global_batch_size
    zero = cfg["zero_optimization"]
    assert zero["stage"] == p.backend_part.zero_stage
    assert ("offload_optimizer" in zero) == (p.offload != "none")
    assert ("offload_param" in zero) == (p.offload == "optimizer+params")
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]
    assert cfg["gradient_clipping"] == r.train.max_grad_norm
    json.dumps(cfg)


def test_deepspeed_config_on_a_cpu_has_no_mixed_precision(recipe):
    # The trainer's bf16/fp16 switches are off on a CPU; transformers refuses a DeepSpeed config that disagrees.
    r = recipe("Qwen/Qwen2.5-0.5B", distributed={"backend": "deepspeed"}, model={"dtype": "bf16"})
    cfg = deepspeed_config(make_plan(r, parse_hardware("cpu")), r)
    assert not cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"]


def test_fsdp_plugin_config(recipe):
    r = recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "fsdp"}, train={"gradient_checkpointing": True})
    p = make_plan(r, parse_hardware("8xH100-80GB"))
    cfg = fsdp_plugin_config(p, r)
    assert cfg["fsdp_version"] == 2 and cfg["reshard_after_forward"] is True
    assert cfg["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert cfg["transformer_cls_names_to_wrap"] == ["LlamaDecoderLayer"]
    assert cfg["activation_checkpointing"] is True and cfg["cpu_offload"] is False
    assert cfg["state_dict_type"] == "SHARDED_STATE_DICT"


def test_accelerate_accepts_the_fsdp_plugin_config(recipe, monkeypatch):
    accelerate = pytest.importorskip("accelerate")
    pytest.importorskip("torch")
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)  # the plugin sets it for transformers
    for preset in ("fsdp_full_shard", "fsdp_shard_grad_op", "fsdp_full_shard_offload"):
        r = recipe("Qwen/Qwen2.5-7B", distributed={"backend": "fsdp", "preset": preset})
        cfg = fsdp_plugin_config(make_plan(r, parse_hardware("8xH100-80GB")), r)
        plugin = accelerate.utils.FullyShardedDataParallelPlugin(**cfg)
        assert plugin.fsdp_version == 2
        assert plugin.reshard_after_forward is cfg["reshard_after_forward"]
        assert plugin.transformer_cls_names_to_wrap == ["Qwen2DecoderLayer"]
        # FSDP2 turns the flag into a policy object: CPUOffloadPolicy when offloading, else OffloadPolicy
        assert (type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") == cfg["cpu_offload"]


def test_megatron_settings(recipe):
    r = recipe("meta-llama/Llama-3.1-405B", "pretrain", data={"sequence_len": 8192}, train={"global_batch_size": 1024})
    p = make_plan(r, parse_hardware("8x8xH100-80GB"))
    cfg = megatron_parallel_settings(p, r)
    model, train = cfg["model"], cfg["train"]
    assert model["tensor_model_parallel_size"] * model["pipeline_model_parallel_size"] * cfg["data_parallel_size"] == 64
    assert model["sequence_parallel"] == (p.tensor_parallel > 1)
    assert train["global_batch_size"] == 1024 and train["micro_batch_size"] == p.micro_batch_size
    assert cfg["optimizer"]["optimizer_cpu_offload"] == (p.offload != "none")


def test_artifacts_refuse_another_backend(recipe):
    r = recipe("tiny:llama", train={"global_batch_size": 8})
    p = make_plan(r, parse_hardware("cpu"))
    for make in (deepspeed_config, fsdp_plugin_config, megatron_parallel_settings):
        with pytest.raises(RecipeError, match="uses backend single"):
            make(p, r)


# ----------------------------------------------------------------------------- no heavy imports
