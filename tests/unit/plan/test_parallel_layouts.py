"""Tensor- and context-parallel layouts: when the planner adds them, what they cost per GPU, and the
layouts a model or a sequence cannot take (located errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.activations import activation_bytes
from recipeforge.plan.catalog import resolve_model
from recipeforge.backends.fsdp_memory import fsdp_gathered
from recipeforge.plan.memory import estimate
from recipeforge.plan.parallel_layouts import TP_PLAN_MODEL_TYPES
from recipeforge.plan.workload import build_workload
from recipeforge.plan.planners import Planners
from plan_testing import bound_layout

ROOT = Path(__file__).resolve().parents[3]
LONG = dict(model={"attn_implementation": "sdpa"}, data={"sequence_len": 32768, "packing": False},
            train={"global_batch_size": 16})


@pytest.fixture
def recipe():
    """recipe(model_id, model={...}, data={...}, ...) -> a validated SFT recipe (a `model:` section too)."""
    from recipeforge.config.schema import recipe_adapter

    def build(name: str, **sections):
        data = {"datasets": [{"path": "data.jsonl", "format": "alpaca"}], **sections.pop("data", {})}
        raw = {"stage": "sft", "model": {"name_or_path": name, **sections.pop("model", {})}, "data": data, **sections}
        return recipe_adapter().validate_python(raw)

    return build


def plan(recipe, spec):
    return make_plan(recipe, parse_hardware(spec))


def refused(recipe, spec) -> RecipeError:
    with pytest.raises(RecipeError) as err:
        plan(recipe, spec)
    return err.value


# ----------------------------------------------------------------------------- choices

def test_32k_context_needs_context_parallel_on_8xh100(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", **LONG, distributed={"backend": "fsdp"}), "8xH100-80GB")
    assert p.backend == "fsdp" and p.extra.context_parallel > 1 and p.tensor_parallel == 1
    assert p.world_size == 8 and p.data_parallel * p.extra.context_parallel == 8
    assert p.backend_part.dp_shard * p.backend_part.dp_replicate == p.data_parallel
    # FSDP alone was evaluated first and did not fit: the reason says so with its numbers
    assert "fsdp fsdp_full_shard needs" in p.reasons["backend"].reason or any(
        r["label"] == "fsdp fsdp_full_shard" and not r["fits"] for r in p.extra.runners_up)
    assert "ring attention" in p.reasons["context_parallel"].reason
    terms = p.reasons["activations"].reason
    assert "O(s)" in terms and f"/ context parallel {p.extra.context_parallel}" in terms


def test_context_parallel_is_not_planned_when_fsdp_alone_fits(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", **{**LONG, "data": {"sequence_len": 4096, "packing": False}},
                    distributed={"backend": "fsdp"}), "8xH100-80GB")
    assert (p.extra.context_parallel, p.tensor_parallel) == (1, 1)
    assert p.reasons["context_parallel"].value == 1


def test_tensor_parallel_is_planned_when_fully_sharded_is_not_enough(recipe):
    # 8192 tokens without recomputation: every layer keeps its attention and MLP activations, which
    # tensor parallel splits over the heads and MLP columns
    r = recipe("meta-llama/Llama-3.1-8B", data={"sequence_len": 8192},
               train={"global_batch_size": 16, "gradient_checkpointing": False}, distributed={"backend": "fsdp"})
    p = plan(r, "8xH100-80GB")
    assert p.tensor_parallel > 1 and p.extra.context_parallel == 1
    assert p.tensor_parallel * p.data_parallel == 8
    full = [x for x in p.extra.runners_up if x["label"] == "fsdp fsdp_full_shard"][0]
    assert not full["fits"] and full["memory_gb"] > p.memory_gb["total"]
    assert "heads" in p.reasons["tensor_parallel"].reason


@pytest.mark.parametrize("name, spec", [("llama3-8b-32k-sft-cp.yaml", "1x8xH100-80GB"),
                                        ("llama3-70b-sft-tp-fsdp.yaml", "4x8xH100-80GB")])
def test_the_parallel_examples_plan_on_their_hardware(name, spec):
    loaded = load_recipe(ROOT / "examples" / "yaml" / name)
    p = make_plan(loaded.recipe, parse_hardware(spec))
    assert p.backend == "fsdp" and p.memory_gb["total"] <= p.extra.memory_limit_gb
    if "cp" in name:
        assert p.extra.context_parallel >= 2
    else:
        assert p.tensor_parallel >= 2


def test_pinned_sizes_are_used_as_given(recipe):
    p = plan(recipe("meta-llama/Llama-3.1-8B", **LONG, distributed={"backend": "fsdp", "context_parallel": 4}),
             "8xH100-80GB")
    assert (p.extra.context_parallel, p.data_parallel, p.backend_part.dp_shard) == (4, 2, 2)
    assert p.reasons["context_parallel"].reason == "recipe pins it"
    p = plan(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "fsdp", "tensor_parallel": 2,
                                                            "data_parallel_replicate": 2}), "2x8xH100-80GB")
    assert (p.tensor_parallel, p.backend_part.dp_replicate, p.backend_part.dp_shard, p.data_parallel) == (2, 2, 4, 8)


# ----------------------------------------------------------------------------- activation model

def _workload(recipe, spec="8xH100-80GB"):
    hw = parse_hardware(spec)
    model, _ = resolve_model(recipe.model.name_or_path)
    return build_workload(recipe, model, hw, Planners.installed())


def test_activations_split_by_context_and_tensor_parallel(recipe):
    w = _workload(recipe("meta-llama/Llama-3.1-8B", **LONG))
    tokens = 32768
    whole = activation_bytes(w, tokens, layers=32, checkpointing=False)
    assert activation_bytes(w, tokens, layers=32, checkpointing=False, context_parallel=4) == pytest.approx(whole / 4)
    # transformers' tensor-parallel plans split attention and MLP, not the norms: less than 1/t saved
    tp2 = activation_bytes(w, tokens, layers=32, checkpointing=False, tensor_parallel=2, sequence_parallel=False)
    assert whole / 2 < tp2 < whole
    # Megatron's sequence parallel splits everything
    assert activation_bytes(w, tokens, layers=32, checkpointing=False, tensor_parallel=2) == pytest.approx(whole / 2)
    # recomputation keeps layer inputs, which tensor parallel without sequence parallel does not split
    ck = activation_bytes(w, tokens, layers=32, checkpointing=True)
    ck_tp = activation_bytes(w, tokens, layers=32, checkpointing=True, tensor_parallel=2, sequence_parallel=False)
    assert ck_tp > ck / 2


def test_eager_attention_grows_quadratically_fused_linearly(recipe):
    def per_sequence(attention, seq):
        r = recipe("meta-llama/Llama-3.1-8B", model={"attn_implementation": attention},
                   data={"sequence_len": seq, "packing": False})
        w = _workload(r)
        return activation_bytes(w, seq, layers=32, checkpointing=False)

    assert per_sequence("sdpa", 8192) / per_sequence("sdpa", 4096) == pytest.approx(2.0)
    assert per_sequence("eager", 8192) / per_sequence("eager", 4096) > 3.0


def test_memory_estimate_of_a_tensor_parallel_layout_divides_model_states(recipe):
    w = _workload(recipe("meta-llama/Llama-3.1-70B"), "2x8xH100-80GB")
    fsdp = bound_layout("fsdp", "fsdp_full_shard", data_parallel=16, nodes=2, gpus_per_node=8)
    tp = bound_layout("fsdp", "fsdp_full_shard", data_parallel=4, tensor_parallel=4, nodes=2, gpus_per_node=8)
    a, b = estimate(w, fsdp, 1, True), estimate(w, tp, 1, True)
    # the same GPUs hold the states either way (sharded 16 ways, or 4 x tensor 4)
    assert b.components["optimizer"] == pytest.approx(a.components["optimizer"])
    ga, gb = fsdp_gathered(w, fsdp), fsdp_gathered(w, tp)
    assert (gb.forward, gb.backward, gb.layer_later) == pytest.approx((ga.forward / 4, ga.backward / 4,
                                                                       ga.layer_later / 4))
    assert b.components["activations"] < a.components["activations"]


# ----------------------------------------------------------------------------- refusals

def test_tensor_parallel_must_divide_the_attention_and_kv_heads(recipe):
    err = refused(recipe("meta-llama/Llama-3.1-8B", distributed={"backend": "fsdp", "tensor_parallel": 3}),
                  "1x6xH100-80GB")
    assert err.problems[0].key == "distributed.tensor_parallel" and "32 attention heads" in str(err)
    # phi-4: 40 heads, 10 key/value heads
    err = refused(recipe("microsoft/phi-4", distributed={"backend": "fsdp", "tensor_parallel": 4}), "8xH100-80GB")
    assert "10 key/value heads" in str(err)


def test_a_model_type_without_a_tensor_parallel_plan_is_refused(recipe):
    err = refused(recipe("openai-community/gpt2", distributed={"backend": "fsdp", "tensor_parallel": 2}),
                  "8xH100-80GB")
    assert err.problems[0].key == "distributed.tensor_parallel" and "no tensor-parallel plan" in str(err)


def test_parallel_sizes_must_divide_the_gpus(recipe):
    err = refused(recipe("meta-llama/Llama-3.1-8B", **LONG, distributed={"backend": "fsdp", "context_parallel": 4}),
                  "1x6xH100-80GB")
    assert err.problems[0].key == "distributed.context_parallel" and "does not divide the 6 GPU(s)" in str(err)


@pytest.mark.parametrize("change, key, words", [
    ({"data": {"sequence_len": 1004, "packing": False}}, "data.sequence_len", "2 x context_parallel"),
    ({"data": {"sequence_len": 4096, "packing": True}}, "data.packing", "packed samples"),
    ({"model": {"attn_implementation": "eager"}}, "model.attn_implementation", "sdpa"),
])
def test_context_parallel_needs_split_sequences_sdpa_and_no_packing(recipe, change, key, words):
    sections = {**LONG, **change, "distributed": {"backend": "fsdp", "context_parallel": 4}}
    err = refused(recipe("meta-llama/Llama-3.1-8B", **sections), "8xH100-80GB")
    assert err.problems[0].key == key and words in str(err)


def test_tensor_and_context_parallel_together_are_refused(recipe):
    err = refused(recipe("meta-llama/Llama-3.1-8B", **LONG, distributed={"backend": "fsdp", "tensor_parallel": 2,
                                                                         "context_parallel": 2}), "8xH100-80GB")
    assert "together are not supported" in str(err)


def test_recipe_rules_refuse_a_bad_context_split_before_planning(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {ROOT / 'examples/yaml/llama3-8b-32k-sft-cp.yaml'}\n"
                    "data: {sequence_len: 32766}\ndistributed: {context_parallel: 2}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    problem = err.value.problems[0]
    assert problem.key == "data.sequence_len" and "divisible by 2 x context_parallel (4)" in problem.message
    assert problem.location is not None and problem.location.line == 2


def test_tensor_parallel_plan_table_matches_transformers():
    """Every architecture the planner sizes is in the table exactly when its transformers config
    defines a base_model_tp_plan."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from recipeforge.plan.models import DECODER_LAYER_CLASS

    for model_type in DECODER_LAYER_CLASS:
        config_class = getattr(transformers, CONFIG_MAPPING_NAMES[model_type], None)
        if config_class is None:
            continue
        has_plan = bool(getattr(config_class, "base_model_tp_plan", None))
        assert (model_type in TP_PLAN_MODEL_TYPES) == has_plan, model_type
