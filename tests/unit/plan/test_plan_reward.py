"""The planner sizes a reward model: a one-output score head in place of the LM head (no vocabulary-wide
logits), chosen + rejected per sample, no reference model."""

from __future__ import annotations

import dataclasses

import pytest

from recipeforge.components.tiny_spec import TINY_CONFIGS
from recipeforge.config.schema import recipe_adapter
from recipeforge.plan.catalog import KNOWN_CONFIGS
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.memory import estimate
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.plan import make_plan
from recipeforge.plan.workload import build_workload
from recipeforge.plan.planners import Planners
from plan_testing import bound_layout

MODEL = "meta-llama/Llama-3.1-8B"


def recipe(stage: str, model: str = MODEL, **sections):
    raw = {"stage": stage, "model": {"name_or_path": model},
           "data": {"datasets": [{"path": "pairs.jsonl", "format": "preference"}], "sequence_len": 2048},
           "train": {"global_batch_size": 8, "micro_batch_size": 4}, **sections}
    return recipe_adapter().validate_python(raw)


def workload(r, hardware: str = "8xH100-80GB"):
    spec = spec_from_config(KNOWN_CONFIGS.get(r.model.name_or_path) or TINY_CONFIGS["llama"], r.model.name_or_path)
    return build_workload(r, spec, parse_hardware(hardware), Planners.installed())


@pytest.mark.parametrize("name", ["tiny:llama", "tiny:qwen2", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B",
                                  "google/gemma-2-2b", "microsoft/phi-2", "openai-community/gpt2"])
def test_score_head_count_equals_transformers(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = dict(TINY_CONFIGS[name[5:]] if name.startswith("tiny:") else KNOWN_CONFIGS[name])
    cfg["n_layer" if cfg["model_type"] == "gpt2" else "num_hidden_layers"] = 2
    spec = dataclasses.replace(spec_from_config(cfg), num_labels=1)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg, num_labels=1)
    with torch.device("meta"):
        model = transformers.AutoModelForSequenceClassification.from_config(config)
    assert spec.total_params() == sum({id(p): p.numel() for p in model.parameters()}.values())
    assert spec.head_params() == model.score.weight.numel()


def test_reward_workload_has_pairs_a_score_head_and_no_reference():
    w, dpo = workload(recipe("reward", adapter={"type": "none"})), workload(recipe("dpo", adapter={"type": "none"}))
    assert w.sequences_per_sample == dpo.sequences_per_sample == 2
    assert w.model.num_labels == 1 and w.model.head_params() == w.model.hidden_size
    assert not w.reference_model and dpo.reference_model
    # one score per token instead of 128k vocabulary logits (LM head: 525M parameters, score: 4096)
    assert dpo.model.total_params() - w.model.total_params() == w.model.vocab_size * w.model.hidden_size - 4096


def test_lora_trains_the_score_head_in_full():
    w = workload(recipe("reward", adapter={"type": "lora", "r": 16}))
    lora = workload(recipe("dpo", adapter={"type": "lora", "r": 16}))
    assert w.trainable_params() == lora.trainable_params() + w.model.hidden_size


def test_memory_terms_drop_the_vocabulary_logits_and_the_reference_model():
    from recipeforge.plan.activations import activation_split, logits_bytes
    from recipeforge.plan.memory import output_gradient_bytes

    layout = bound_layout("single", None)
    w_rw = workload(recipe("reward", adapter={"type": "none"}))
    w_dpo = workload(recipe("dpo", adapter={"type": "none"}))
    rw = estimate(w_rw, layout, micro_batch=4, checkpointing=True, gpu_memory=80 * 2**30).components
    dpo = estimate(w_dpo, layout, micro_batch=4, checkpointing=True, gpu_memory=80 * 2**30).components
    tokens = 4 * 2 * 2048
    assert logits_bytes(w_rw, tokens) == tokens * 2 * 1  # bf16, one score per token
    assert dpo["logits"] == logits_bytes(w_dpo, tokens) > 1000 * logits_bytes(w_rw, tokens)
    assert rw["reference_model"] == 0 and dpo["reference_model"] > 0
    # the head's gradient, not the LM head's
    assert output_gradient_bytes(w_rw, layout, False) < output_gradient_bytes(w_dpo, layout, False) / 1000
    split = [activation_split(w, tokens, layers=w.model.num_layers, checkpointing=True) for w in (w_rw, w_dpo)]
    assert split[0] == split[1]


def test_plan_of_the_tiny_example_names_the_head(tmp_path):
    from recipeforge.config import load_recipe
    from recipeforge.plan.render import render_plan

    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny" / "reward.yaml"
    plan = make_plan(load_recipe(example).recipe)
    assert plan.extra.model["head"] == "sequence classification (1 output)"
    spec = spec_from_config(TINY_CONFIGS["llama"])
    assert plan.extra.model["params"] == spec.total_params() - spec.head_params() + spec.hidden_size
    assert "sequence classification (1 output) head" in render_plan(plan)
