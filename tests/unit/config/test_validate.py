"""Schema validation: located, hinted errors and cross-field rules."""

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.schema import DPORecipe, GRPORecipe, SFTRecipe
from recipeforge.errors import RecipeError

from rf_testing import MINIMAL


def problems(write, text, *overrides):
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", text), list(overrides))
    return {p.key: p for p in exc.value.problems}


def test_minimal_recipe_gets_defaults_and_is_frozen(write):
    r = load_recipe(write("r.yaml", MINIMAL)).recipe
    assert isinstance(r, SFTRecipe)
    assert r.adapter.type == "none" and r.data.packing is False and r.train.micro_batch_size == "auto"
    with pytest.raises(Exception):
        r.train.seed = 3  # immutable


def test_pretrain_packs_by_default(write):
    text = MINIMAL.replace("sft", "pretrain").replace("alpaca", "text")
    assert load_recipe(write("r.yaml", text)).recipe.data.packing is True


def test_typo_key_gets_did_you_mean_at_its_line(write):
    p = problems(write, MINIMAL + "adapter:\n  type: lora\n  lora_alpah: 16\n")["adapter.lora_alpah"]
    assert p.message == "unknown key 'lora_alpah'" and p.hint == "did you mean 'alpha'?"
    assert (p.location.line, p.location.col) == (9, 3)


def test_unknown_top_level_key_and_stage_only_section(write):
    ps = problems(write, MINIMAL + "trian: {seed: 1}\ndpo: {beta: 0.1}\n")
    assert ps["trian"].hint == "did you mean 'train'?"
    assert ps["dpo"].hint == "the 'dpo:' section applies only to stage: dpo"


def test_wrong_type(write):
    p = problems(write, MINIMAL + "train:\n  seed: lots\n")["train.seed"]
    assert p.message == "expected an integer (got 'lots')" and p.location.line == 8


def test_out_of_range(write):
    p = problems(write, MINIMAL + "adapter:\n  dropout: 1.5\n")["adapter.dropout"]
    assert p.message == "must be < 1 (got 1.5)"


def test_enum_with_did_you_mean(write):
    p = problems(write, MINIMAL.replace("alpaca", "alpacca"))["data.datasets[0].format"]
    assert p.message.startswith("must be one of text, alpaca") and p.hint == "did you mean 'alpaca'?"
    assert p.location.line == 6


def test_union_field_lists_alternatives(write):
    p = problems(write, MINIMAL + "train: {micro_batch_size: big}\n")["train.micro_batch_size"]
    assert p.message == "expected auto or an integer (got 'big')"


def test_missing_required_key_points_at_parent(write):
    p = problems(write, "stage: sft\nmodel: {dtype: bf16}\ndata:\n  datasets: [{path: a, format: text}]\n")
    assert p["model.name_or_path"].message == "required key 'name_or_path' is missing"
    assert p["model.name_or_path"].location.line == 2


def test_bad_stage_still_reports_other_problems(write):
    ps = problems(write, MINIMAL.replace("stage: sft", "stage: stf") + "train: {seed: -1}\n")
    assert ps["stage"].hint == "did you mean 'sft'?" and "train.seed" in ps


def test_all_problems_reported_together_sorted_by_line(write):
    with pytest.raises(RecipeError) as exc:
        load_recipe(write("r.yaml", MINIMAL + "train: {seed: -1, learning_rate: 0}\nadapter: {r: 0}\n"))
    lines = [p.location.line for p in exc.value.problems]
    assert len(lines) == 3 and lines == sorted(lines)


@pytest.mark.parametrize("extra, key, fragment", [
    ("adapter: {type: qlora}\n", "model.dtype", "QLoRA computes in bf16"),
    ("output: {merge_adapter: true}\n", "output.merge_adapter", "no adapter to merge"),
    ("distributed: {backend: ddp, zero_stage: 3}\n", "distributed.zero_stage", "applies to DeepSpeed"),
    ("distributed: {backend: deepspeed, tensor_parallel: 2}\n", "distributed.tensor_parallel", "fsdp or megatron"),
    ("distributed: {backend: fsdp, pipeline_parallel: 2}\n", "distributed.pipeline_parallel", "megatron"),
    ("distributed: {backend: ddp, context_parallel: 2}\n", "distributed.context_parallel", "needs the fsdp backend"),
    ("distributed: {backend: ddp, offload: optimizer}\n", "distributed.offload", "cannot offload"),
    ("train: {global_batch_size: 4, micro_batch_size: 8}\n", "train.micro_batch_size", "larger than the global"),
    ("train: {load_best_model_at_end: true}\n", "train.load_best_model_at_end", "needs evaluation data"),
    ("kernels: [ligre]\n", "kernels.ligre", "unknown kernel"),
    ("train: {qat: {scheme: int4_weight}}\nadapter: {type: qlora}\n", "train.qat", "already 4-bit"),
    ("train: {qat: {scheme: int4_weight}}\nadapter: {type: lora}\n", "train.qat", "merged weights"),
    ("train: {qat: {scheme: int4_weight}}\ndistributed: {backend: megatron}\n", "train.qat.scheme",
     "Megatron-Core builds its own"),
    ("", "data.val_size", "share must be below 1"),
])
def test_cross_field_rules(write, extra, key, fragment):
    overrides = {"model.dtype": ["model.dtype=fp32"], "data.val_size": ["data.val_size=1.5"]}.get(key, [])
    ps = problems(write, MINIMAL + extra, *overrides)
    assert key in ps, ps
    assert fragment in ps[key].message


def test_dpo_needs_preference_data(write):
    ps = problems(write, MINIMAL.replace("sft", "dpo"))
    assert ps["data.datasets[0].format"].message == "stage 'dpo' cannot train on format 'alpaca'"
    ok = load_recipe(write("ok.yaml", MINIMAL.replace("sft", "dpo").replace("alpaca", "preference"))).recipe
    assert isinstance(ok, DPORecipe) and ok.dpo.beta == 0.1


def test_grpo_needs_a_reward(write):
    text = MINIMAL.replace("sft", "grpo").replace("alpaca", "prompt")
    ps = problems(write, text + "grpo: {rewards: []}\n")
    assert "grpo.rewards" in ps and "at least 1" in ps["grpo.rewards"].message
    ps = problems(write, text)
    assert ps["grpo"].message == "required key 'grpo' is missing"
    ok = load_recipe(write("ok.yaml", text + "grpo: {num_generations: 4, rewards: [{name: length}]}\n"
                           "train: {global_batch_size: 8}\n")).recipe
    assert isinstance(ok, GRPORecipe) and ok.grpo.rewards[0].name == "length"


def test_grpo_batch_divisible_by_group(write):
    text = MINIMAL.replace("sft", "grpo").replace("alpaca", "prompt")
    ps = problems(write, text + "grpo: {num_generations: 3, rewards: [{name: length}]}\ntrain: {global_batch_size: 8}\n")
    assert "divisible by grpo.num_generations" in ps["train.global_batch_size"].message


def test_qat_scheme_and_group_size_are_checked_at_their_keys(write):
    ps = problems(write, MINIMAL + "train: {qat: {scheme: int3_weight, group_size: 48}}\n")
    assert "int4_weight" in ps["train.qat.scheme"].message and "train.qat.group_size" in ps
    ok = load_recipe(write("ok.yaml", MINIMAL + "train: {qat: {scheme: int8_dynamic_act_int4_weight}}\n")).recipe
    assert ok.train.qat.scheme == "int8_dynamic_act_int4_weight" and ok.train.qat.group_size == 32
    assert load_recipe(write("off.yaml", MINIMAL)).recipe.train.qat is None
