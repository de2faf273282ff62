"""What a stage is, as its `StageSpec` says, for a plugin's stage as for a built-in one: the planner's
workload (sequences per sample, a reference model, a score head), the language-model data (masked
prompts, long rows split, packing by default, streaming), activation offloading, tensor parallel and
the least micro batch are read from the spec, never from a list of built-in stage names.

Two plugin stages alike but for their facts: `plain_lm` sets none, `facts_lm` sets every one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

DATA = Path(__file__).resolve().parents[3] / "examples" / "data"

SPEC = """
from pydantic import Field
from recipeforge.config.schema.base import Section
from recipeforge.stage_specs import StageSpec

class Config(Section):
    reference: str = Field("auto", description="the reference model")

STAGE = StageSpec({name!r}, "A test stage.", "rf_{name}.runner:Runner", "trained for a test", section={name!r},
                  section_model=Config, format_kinds=("lm",){facts})
"""
FACTS = dict(sequences_per_sample=2, reference_model=True, scores=True, masks_inputs=True, splits_long_rows=True,
             packs_by_default=True, streams=True, activation_offload=True, model_parallel=True, min_micro_batch=2,
             min_micro_batch_why="it compares rows in pairs")


@pytest.fixture
def stages(dists):
    """`plain_lm` (no facts set) and `facts_lm` (each fact set) installed for the test."""
    for name, facts in (("plain_lm", {}), ("facts_lm", FACTS)):
        extra = "".join(f", {k}={v!r}" for k, v in facts.items())
        dists.add(f"rf-{name}", {"recipeforge.stages": {name: f"rf_{name}:STAGE"}},
                  {f"rf_{name}.py": SPEC.format(name=name, facts=extra)})
    return ("plain_lm", "facts_lm")


def _recipe(tmp_path: Path, stage: str, data: dict | None = None, **sections: dict):
    body = {"datasets": [{"path": str(DATA / "pretrain.jsonl"), "format": "text"}], "sequence_len": 64,
            "cache_dir": str(tmp_path / "cache"), **(data or {})}
    path = tmp_path / f"{stage}.yaml"
    path.write_text(json.dumps({"stage": stage, "model": {"name_or_path": "tiny:llama"}, "hardware": {"gpus_per_node": 0},
                                "data": body, "train": {"max_steps": 10, "global_batch_size": 8,
                                                        "micro_batch_size": 4}, **sections}))
    return load_recipe(path).recipe


def test_the_plugin_spec_carries_each_fact(stages):
    from recipeforge.stage_specs import stage_spec

    plain, facts = (stage_spec(s) for s in stages)
    for field, value in FACTS.items():
        assert getattr(facts, field) == value and getattr(plain, field) != value, field


def test_the_workload_reads_sequences_reference_and_score_head_from_the_spec(stages, tmp_path):
    from recipeforge.plan.catalog import resolve_model
    from recipeforge.plan.stage_shape import stage_shape

    model, _ = resolve_model("tiny:llama")
    notes: list[str] = []
    plain = stage_shape(_recipe(tmp_path, "plain_lm"), model, notes)
    assert (plain.sequences_per_sample, plain.reference_model, plain.model.num_labels) == (1, False, model.num_labels)
    facts = stage_shape(_recipe(tmp_path, "facts_lm"), model, notes)
    # chosen and rejected; a full fine-tune keeps a reference model; one score in place of the LM head
    assert (facts.sequences_per_sample, facts.reference_model, facts.model.num_labels) == (2, True, 1)
    assert notes == []
    lora = _recipe(tmp_path, "facts_lm", adapter={"type": "lora"})
    assert not stage_shape(lora, model, notes).reference_model  # the adapter-disabled base serves as reference
    named = _recipe(tmp_path, "facts_lm", adapter={"type": "lora"}, facts_lm={"reference": "tiny:llama"})
    assert stage_shape(named, model, notes).reference_model
    assert notes == ["the FACTS_LM reference model is sized like the policy model"]


def test_the_lm_data_masks_prompts_and_splits_long_rows_as_the_spec_says(stages, tmp_path):
    from recipeforge.components.lm_data import prepare_lm_data
    from recipeforge.components.packing import IGNORE
    from recipeforge.components.tokenizer import build_tiny_tokenizer, set_chat_template

    tok = build_tiny_tokenizer(1024)
    set_chat_template(tok, "chatml", required=True)
    alpaca = {"datasets": [{"path": str(DATA / "sft-alpaca.jsonl"), "format": "alpaca"}], "packing": False}
    labels = {s: prepare_lm_data(_recipe(tmp_path, s, alpaca), tok, base_dir=tmp_path, use_cache=False).train["labels"]
              for s in stages}
    assert not any(IGNORE in row for row in labels["plain_lm"])  # trained on the whole row
    assert all(IGNORE in row for row in labels["facts_lm"])  # the prompt's tokens are masked out

    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"text": " ".join(["the cow says moo"] * 60)}) + "\n" + "".join(
        json.dumps({"text": f"row {i}"}) + "\n" for i in range(20)))
    text = {"datasets": [{"path": str(long), "format": "text"}], "packing": False, "sequence_len": 32}
    plain, facts = (prepare_lm_data(_recipe(tmp_path, s, text), tok, base_dir=tmp_path, use_cache=False).stats
                    for s in stages)
    assert plain["truncated"] == 1 and plain["split_samples"] == 0
    assert facts["truncated"] == 0 and facts["split_samples"] > 1  # one document, several samples


def test_packing_defaults_and_streaming_follow_the_spec(stages, tmp_path):
    assert _recipe(tmp_path, "facts_lm").data.packing is True
    assert _recipe(tmp_path, "plain_lm").data.packing is False
    streamed = {"streaming": True, "val_size": 0}
    _recipe(tmp_path, "facts_lm", streamed)  # accepted
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, "plain_lm", streamed)
    (p,) = info.value.problems
    assert p.key == "data.streaming" and "stage plain_lm reads its rows whole" in p.message, p.message
    assert "streaming is for pretrain and sft" in p.message


def test_activation_offloading_and_tensor_parallel_follow_the_spec(stages):
    from recipeforge.plan.parallel_layouts import combination_refusal
    from recipeforge.stages.activation_offload import check_activation_offloading

    check_activation_offloading("facts_lm", "cuda")
    with pytest.raises(RecipeError, match="not available for the plain_lm stage"):
        check_activation_offloading("plain_lm", "cuda")
    assert combination_refusal(2, 1, stage="facts_lm", adapter="none") is None
    refusal = combination_refusal(2, 1, stage="plain_lm", adapter="none")
    assert refusal is not None and "runs in the pretrain and sft stages" in refusal.message


def test_the_least_micro_batch_is_refused_by_validate_and_plan(stages, tmp_path):
    from recipeforge.plan import make_plan

    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, "facts_lm", train={"max_steps": 10, "global_batch_size": 8, "micro_batch_size": 1})
    (p,) = info.value.problems
    assert p.key == "train.micro_batch_size" and p.location is not None
    assert p.message == ("FACTS_LM needs micro batches of 2 or more rows (it compares rows in pairs); "
                         "the recipe sets 1")
    assert "set train.micro_batch_size: 2 or more" in (p.hint or "")
    recipe = _recipe(tmp_path, "facts_lm", train={"max_steps": 10, "global_batch_size": 8, "micro_batch_size": "auto"})
    assert make_plan(recipe).micro_batch_size >= 2
    plain = _recipe(tmp_path, "plain_lm", train={"max_steps": 10, "global_batch_size": 8, "micro_batch_size": 1})
    assert plain.train.micro_batch_size == 1


@pytest.mark.parametrize("field, value, why", [
    ("sequences_per_sample", 0, "sequences_per_sample must be 1 or more"),
    ("min_micro_batch", 0, "min_micro_batch must be 1 or more"),
])
def test_a_bad_fact_is_refused_at_stage(dists, tmp_path, field, value, why):
    dists.add("rf-odd", {"recipeforge.stages": {"odd": "rf_odd:STAGE"}},
              {"rf_odd.py": SPEC.format(name="odd", facts=f", {field}={value}")})
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, "odd")
    assert any(p.key == "stage" and why in p.message for p in info.value.problems), info.value.problems


def test_a_reference_model_needs_a_reference_key(dists, tmp_path):
    source = SPEC.format(name="odd", facts=", reference_model=True").replace(
        'reference: str = Field("auto", description="the reference model")', "beta: float = 0.1")
    dists.add("rf-odd", {"recipeforge.stages": {"odd": "rf_odd:STAGE"}}, {"rf_odd.py": source})
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, "odd")
    assert any(p.key == "stage" and "reference_model needs a recipe section with a `reference` field" in p.message
               for p in info.value.problems), info.value.problems


def test_the_model_card_of_a_scoring_stage_says_text_classification(stages, tmp_path):
    from recipeforge.plan import make_plan
    from recipeforge.tools.model_card import render_model_card

    cards = {}
    for stage in stages:
        recipe = _recipe(tmp_path, stage)
        cards[stage] = render_model_card(recipe=recipe, recipe_data={}, plan=make_plan(recipe), data_stats={},
                                         run_dir=tmp_path, adapter=False)
    assert "pipeline_tag: text-generation" in cards["plain_lm"]
    assert "pipeline_tag: text-classification" in cards["facts_lm"]
