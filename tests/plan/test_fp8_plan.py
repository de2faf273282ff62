"""`train.precision: fp8` in the planner: the planned GPU must have float8 tensor cores, the layers that
convert come from the model's shapes, and the memory model changes only where float8 changes it (the
casts of one layer, FSDP2's float8 all-gather); DeepSpeed and Megatron layouts are never planned."""

from __future__ import annotations

import pytest

from plan_testing import build_recipe
from recipeforge.config.schema.rules import check_rules
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.plan import make_plan

LLAMA_8B = "meta-llama/Llama-3.1-8B"
H100 = parse_hardware("8xH100-80GB")


def _plan(hardware=H100, model=LLAMA_8B, **train):
    return make_plan(build_recipe(model, train={"global_batch_size": 64, **train},
                                  data={"sequence_len": 2048}), hardware)


def test_fp8_on_h100_names_the_converted_and_the_bf16_layers():
    plan = _plan(precision="fp8")
    assert plan.reasons["precision"].value == "fp8"
    why = plan.reasons["fp8"].reason
    assert plan.reasons["fp8"].value == "tensorwise"
    assert "7 linear layers per decoder layer" in why and "q_proj" in why and "down_proj" in why
    assert "LM head" in why and "embeddings" in why and "norms" in why
    assert "activations saved for backward stay bf16" in why
    assert plan.to_dict()["reasons"]["fp8"]["value"] == "tensorwise"  # `plan --json`


def test_a_bf16_plan_has_no_fp8_entry():
    assert "fp8" not in _plan(precision="mixed").reasons


@pytest.mark.parametrize("spec,gpu", [("1xA100-80GB", "A100-80GB"), ("8xV100-32GB", "V100-32GB"),
                                      ("1xT4-16GB", "T4-16GB")])
def test_gpus_without_float8_tensor_cores_are_refused_naming_the_gpu(spec, gpu):
    with pytest.raises(RecipeError) as err:
        _plan(parse_hardware(spec), precision="fp8")
    assert err.value.problems[0].key == "train.precision" and gpu in str(err.value)


def test_the_cpu_is_refused():
    with pytest.raises(RecipeError) as err:
        _plan(parse_hardware("cpu"), model="tiny:llama", precision="fp8")
    assert err.value.problems[0].key == "train.precision" and "CPU" in str(err.value)


@pytest.mark.parametrize("spec", ["1xL4-24GB", "1xL40S-48GB", "8xH200-141GB", "8xB200-180GB", "1xRTX4090-24GB"])
def test_gpus_with_float8_tensor_cores_plan(spec):
    plan = make_plan(build_recipe("tiny:llama", train={"precision": "fp8", "global_batch_size": 8}),
                     parse_hardware(spec))
    assert plan.reasons["precision"].value == "fp8"


def test_fsdp_gathers_the_converted_layers_in_float8():
    pins = {"distributed": {"backend": "fsdp", "preset": "fsdp_full_shard"}}
    recipe = dict(train={"global_batch_size": 64, "micro_batch_size": 1}, data={"sequence_len": 2048}, **pins)
    fp8 = make_plan(build_recipe(LLAMA_8B, **{**recipe, "train": {**recipe["train"], "precision": "fp8"}}), H100)
    bf16 = make_plan(build_recipe(LLAMA_8B, **recipe), H100)
    rowwise = make_plan(build_recipe(LLAMA_8B, **{**recipe, "train": {
        **recipe["train"], "precision": "fp8", "fp8": {"scaling": "rowwise"}}}), H100)
    assert bf16.reasons["precision"].value == "mixed"
    # the same fp32 shards: weights, gradients and optimizer states do not change
    for part in ("weights", "gradients", "optimizer"):
        assert fp8.memory_gb[part] == bf16.memory_gb[part]
    # one gathered layer at one byte per converted weight instead of two (~0.2 GB of Llama 8B's 0.4 GB)
    assert fp8.memory_gb["gathered_params"] < bf16.memory_gb["gathered_params"]
    assert rowwise.memory_gb["gathered_params"] > fp8.memory_gb["gathered_params"]  # rowwise gathers bf16
    assert "all-gathers the converted weights in float8" in fp8.reasons["fp8"].reason
    assert "all-gathers in bf16" in rowwise.reasons["fp8"].reason and "torch_compile" in rowwise.reasons["fp8"].reason


def test_single_gpu_keeps_fp32_masters_and_counts_the_float8_casts():
    recipe = dict(train={"global_batch_size": 8, "micro_batch_size": 1}, distributed={"backend": "single"})
    fp8 = make_plan(build_recipe("meta-llama/Llama-3.2-1B", **{**recipe, "train": {**recipe["train"],
                                                                               "precision": "fp8"}}),
                    parse_hardware("1xH100-80GB"))
    mixed = make_plan(build_recipe("meta-llama/Llama-3.2-1B", **{**recipe, "train": {**recipe["train"],
                                                                                 "precision": "mixed"}}),
                      parse_hardware("1xH100-80GB"))
    assert fp8.memory_gb["weights"] == mixed.memory_gb["weights"]  # fp32 masters as mixed precision keeps
    assert fp8.memory_gb["total"] >= mixed.memory_gb["total"]      # plus one layer's float8 casts


def test_deepspeed_is_never_planned_and_a_pinned_one_is_refused():
    plan = _plan(precision="fp8")
    assert plan.backend != "deepspeed"
    assert all(r["backend"] != "deepspeed" for r in plan.extra.runners_up)
    problems = check_rules(build_recipe(LLAMA_8B, train={"precision": "fp8"}, distributed={"backend": "deepspeed"}))
    assert [p.path for p in problems] == [("train", "precision")]
    assert "not with DeepSpeed ZeRO" in problems[0].message


@pytest.mark.parametrize("sections,says", [
    ({"adapter": {"type": "lora"}}, "full training"), ({"adapter": {"type": "qlora"}}, "full training"),
    ({"train": {"precision": "fp8", "qat": {"scheme": "int4_weight"}}}, "train.qat"),
    ({"model": {"dtype": "fp16"}}, "model.dtype is fp16"), ({"model": {"dtype": "fp32"}}, "model.dtype is fp32"),
    ({"distributed": {"backend": "megatron"}}, "Transformer Engine")])
def test_what_fp8_does_not_compose_with_is_refused_at_train_precision(sections, says):
    train = sections.pop("train", {"precision": "fp8"})
    problems = check_rules(build_recipe(LLAMA_8B, train=train, **sections))
    assert problems and problems[0].path == ("train", "precision"), problems
    assert says in problems[0].message, problems[0].message


def test_train_fp8_without_fp8_precision_is_refused_at_its_key():
    problems = check_rules(build_recipe(LLAMA_8B, train={"fp8": {"scaling": "rowwise"}}))
    assert [p.path for p in problems] == [("train", "fp8")]


def test_layers_whose_dims_are_not_multiples_of_16_stay_bf16():
    from recipeforge.plan.fp8 import converted, kept
    from recipeforge.plan.catalog import resolve_model

    spec, _ = resolve_model("tiny:llama", None)
    names = {lin.name for lin in converted(spec)} | {lin.name for lin in kept(spec)}
    assert names == {lin.name for lin in spec.nn_linears()}
    for lin in kept(spec):
        assert lin.in_features % 16 or lin.out_features % 16
