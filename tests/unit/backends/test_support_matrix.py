"""One support matrix: the recipe rules, the planner and each backend's `check()` read the same
capability records (`recipeforge.capabilities`), so they accept and refuse the same combinations.

Every backend x stage x device x adapter x offload combination is validated (as `recipeforge
validate` does, the device known from the recipe's `hardware:` section), planned on a recipe built
without the rules (as `train` would plan it if validation let it through) and checked by the backend.
Each step either accepts or refuses with a located one-line `RecipeError`, and the three agree.
"""

from __future__ import annotations

import copy
import itertools
from functools import lru_cache
from pathlib import Path

import pytest

from recipeforge.backends import get_backend
from recipeforge.capabilities import BUILTIN, with_support_table
from recipeforge.config.pipeline import resolve_tree
from recipeforge.config.schema.recipe import recipe_adapter
from recipeforge.config.validate import validate_tree
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import hardware_for
from recipeforge.plan.world import plan_for_world

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {"pretrain": "pretrain", "sft": "sft-full", "dpo": "dpo", "grpo": "grpo"}
HARDWARE = {"cpu": {"nodes": 1, "gpus_per_node": 0}, "cuda": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-80GB"}}
BACKENDS = tuple(BUILTIN)
COMBINATIONS = list(itertools.product(BACKENDS, EXAMPLES, HARDWARE, ("none", "lora", "qlora"),
                                      ("none", "optimizer", "optimizer+params")))


@lru_cache(maxsize=None)
def _base_tree(stage: str):
    tree, _ = resolve_tree(ROOT / "examples" / "yaml" / "tiny" / f"{EXAMPLES[stage]}.yaml")
    return tree


def _tree(backend, stage, device, adapter, offload):
    tree = copy.deepcopy(_base_tree(stage))
    data = tree.data
    data["distributed"] = {**data.get("distributed", {}), "backend": backend, "offload": offload}
    data["hardware"] = dict(HARDWARE[device])
    data["adapter"] = {**data.get("adapter", {}), "type": adapter}
    data["train"] = {**data["train"], "micro_batch_size": "auto"}
    if adapter == "qlora":
        data["model"] = {**data["model"], "dtype": "bf16"}  # QLoRA computes in 16 bits (its own rule)
    if adapter == "none":
        data["output"] = {**data.get("output", {}), "merge_adapter": False}
    return tree


def _outcome(step):
    """None when `step()` accepts, the refusal's (key, message) when it raises a `RecipeError`;
    any other exception fails the test."""
    try:
        step()
    except RecipeError as exc:
        p = exc.problems[0]
        assert p.key, f"a refusal without a key: {p.message}"
        assert "\n" not in p.message, f"a refusal of more than one line: {p.message!r}"
        return p.key, p.message
    return None


def _plan_and_check(recipe):
    plan = plan_for_world(recipe, hardware=hardware_for(recipe, None))
    assert plan.backend == recipe.distributed.backend
    # What the backend runs; whether its package is installed on this machine is another question.
    get_backend(plan.backend).check_supported(plan, recipe)


def test_validate_plan_and_check_agree_on_every_combination():
    disagree, refused = [], 0
    for combo in COMBINATIONS:
        tree = _tree(*combo)
        validated = _outcome(lambda: validate_tree(tree))
        recipe = recipe_adapter().validate_python(tree.data)  # the recipe without the rules
        planned = _outcome(lambda: _plan_and_check(recipe))
        refused += validated is not None
        if (validated is None) != (planned is None):
            disagree.append(f"{combo}: validate {validated or 'accepts'}, plan/check {planned or 'accepts'}")
    assert not disagree, "\n".join(disagree)
    assert 0 < refused < len(COMBINATIONS)  # the matrix has holes, and it is not all holes


@pytest.mark.parametrize("combo, key, fragment", [
    (("fsdp", "sft", "cpu", "lora", "optimizer+params"), "distributed.offload",
     "cannot offload optimizer+params on the CPU"),
    (("megatron", "sft", "cpu", "lora", "none"), "distributed.backend", "needs CUDA GPUs"),
    (("megatron", "dpo", "cuda", "none", "none"), "distributed.backend", "runs pretrain and sft only"),
    (("megatron", "sft", "cuda", "lora", "optimizer+params"), "distributed.offload", "no offload mode"),
    (("ddp", "sft", "cuda", "none", "optimizer"), "distributed.offload", "cannot offload"),
])
def test_refusals_are_located_at_the_key_to_change(combo, key, fragment):
    with pytest.raises(RecipeError) as err:
        validate_tree(_tree(*combo))
    problem = err.value.problems[0]
    assert problem.key == key and fragment in problem.message and problem.location is not None


def test_megatron_offload_is_what_the_backend_implements():
    """The record allows optimizer offload because the Megatron settings really switch Megatron-Core's
    optimizer CPU offload on (and nothing offloads parameters)."""
    from dataclasses import replace

    from recipeforge.plan.artifacts import megatron_parallel_settings
    from recipeforge.plan.types import Plan

    recipe = validate_tree(_tree("megatron", "pretrain", "cuda", "none", "optimizer"))
    plan = plan_for_world(recipe, hardware=hardware_for(recipe, None))
    assert plan.offload == "optimizer"
    settings = megatron_parallel_settings(plan, recipe)["optimizer"]
    assert settings["optimizer_cpu_offload"] is True and settings["optimizer_offload_fraction"] == 1.0
    assert not megatron_parallel_settings(replace(plan, offload="none"), recipe)["optimizer"]["optimizer_cpu_offload"]
    assert BUILTIN["megatron"].offload == ("none", "optimizer") and isinstance(plan, Plan)


def test_backend_classes_and_presets_match_their_records():
    from recipeforge.plan.presets import PRESETS, known_preset_names

    for name, caps in BUILTIN.items():
        backend = get_backend(name)
        assert backend.capabilities is caps and tuple(backend.stages) == caps.stages
        assert set(caps.presets) == {p for p in known_preset_names(name) if p != "tp{T}_pp{P}[_offload]"} | (
            {"tp{T}_pp{P}", "tp{T}_pp{P}_offload"} if name == "megatron" else set())
        for preset in caps.presets:
            if preset in PRESETS:
                assert PRESETS[preset].offload in caps.offload, preset


def test_preset_facts_match_the_presets_meaning():
    from recipeforge.capabilities import preset_facts
    from recipeforge.plan.presets import PRESETS, get_preset

    for name in [*PRESETS, "tp2_pp4", "tp8_pp1_offload"]:
        p = get_preset(name)
        assert preset_facts(name) == (p.backend, p.zero_stage, p.offload), name
    assert preset_facts("zero33") is None


def test_docs_support_table_is_generated_from_the_records():
    doc = (ROOT / "docs" / "backends.md").read_text()
    assert doc == with_support_table(doc), (
        "docs/backends.md's support table is stale: run `python -m recipeforge.capabilities docs/backends.md`")
