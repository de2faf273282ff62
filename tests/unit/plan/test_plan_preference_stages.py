"""ORPO, CPO and KTO in the planner: pairs per sample, and a reference model only where KTO keeps one;
the megatron backend refuses the three stages with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipeforge.capabilities import capabilities_of, refusals
from recipeforge.config import load_recipe
from recipeforge.config.schema import recipe_adapter
from recipeforge.plan.catalog import KNOWN_CONFIGS
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.plan import make_plan
from recipeforge.plan.workload import build_workload
from recipeforge.plan.planners import Planners

MODEL = "Qwen/Qwen2.5-0.5B"
TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def recipe(stage: str, **sections):
    fmt = "unpaired" if stage == "kto" else "preference"
    raw = {"stage": stage, "model": {"name_or_path": MODEL},
           "data": {"datasets": [{"path": "rows.jsonl", "format": fmt}], "sequence_len": 1024},
           "train": {"global_batch_size": 8, "micro_batch_size": 4}, **sections}
    return recipe_adapter().validate_python(raw)


def workload(r):
    return build_workload(r, spec_from_config(KNOWN_CONFIGS[MODEL], MODEL), parse_hardware("1xH100-80GB"), Planners.installed())


@pytest.mark.parametrize("stage", ["orpo", "cpo"])
def test_orpo_and_cpo_run_pairs_without_a_reference_model(stage):
    w = workload(recipe(stage))
    assert (w.sequences_per_sample, w.reference_model) == (2, False)
    p = make_plan(recipe(stage, hardware={"gpus_per_node": 1, "gpu": "H100-80GB"}))
    assert "reference_model" not in p.memory_gb


def test_kto_keeps_a_reference_model_unless_adapters_stand_in():
    full = workload(recipe("kto"))
    assert (full.sequences_per_sample, full.reference_model) == (1, True)
    assert workload(recipe("kto", adapter={"type": "lora"})).reference_model is False
    named = workload(recipe("kto", adapter={"type": "lora"}, kto={"reference": "some/model"}))
    assert named.reference_model is True and any("KTO reference" in n for n in named.notes)
    p = make_plan(recipe("kto", hardware={"gpus_per_node": 1, "gpu": "H100-80GB"}))
    assert p.memory_gb["reference_model"] > 0.9


@pytest.mark.parametrize("name", ["orpo", "kto", "simpo"])
def test_tiny_examples_plan_on_cpu(name):
    loaded = load_recipe(TINY / f"{name}.yaml")
    p = make_plan(loaded.recipe)
    assert p.backend == "single" and p.micro_batch_size == 8


@pytest.mark.parametrize("stage", ["orpo", "kto", "cpo"])
def test_megatron_refuses_the_preference_stages(stage):
    found = refusals(capabilities_of("megatron"), stage=stage)
    assert found and f"not {stage}" in found[0].message and "no preference or RL losses" in found[0].message
    assert not refusals(capabilities_of("deepspeed"), stage=stage)


def test_validate_names_the_formats_each_stage_takes(tmp_path):
    from recipeforge.errors import RecipeError

    path = tmp_path / "recipe.yaml"
    path.write_text(f"extends: {TINY / 'kto.yaml'}\ndata:\n  datasets:\n    - path: x.jsonl\n      format: alpaca\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    p = err.value.problems[0]
    assert p.key == "data.datasets[0].format" and (Path(p.location.file), p.location.line) == (path, 5)
    assert "stage 'kto' cannot train on format 'alpaca'" in p.message
    assert p.hint == "use preference or unpaired for stage kto"
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY / "orpo.yaml", overrides=["data.datasets=[{path: x.jsonl, format: unpaired}]"])
    assert err.value.problems[0].hint == "use preference for stage orpo"


def test_model_card_names_the_method(tmp_path):
    from recipeforge.tools.model_card import render_model_card

    for name, what in (("orpo", "trained with ORPO"), ("kto", "trained with KTO"), ("simpo", "trained with SimPO")):
        loaded = load_recipe(TINY / f"{name}.yaml")
        card = render_model_card(recipe=loaded.recipe, recipe_data=loaded.tree.data, plan=make_plan(loaded.recipe),
                                 data_stats={}, run_dir=tmp_path, adapter=False)
        assert what in card
    loaded = load_recipe(TINY / "simpo.yaml", overrides=["cpo.loss_type=sigmoid"])
    card = render_model_card(recipe=loaded.recipe, recipe_data=loaded.tree.data, plan=make_plan(loaded.recipe),
                             data_stats={}, run_dir=tmp_path, adapter=False)
    assert "trained with CPO" in card
