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
from recipeforge.capabilities import all_capabilities, capabilities_of, with_support_table
from recipeforge.config.pipeline import resolve_tree
from recipeforge.config.schema.stage_recipes import recipe_adapter
from recipeforge.config.validate import validate_tree
from recipeforge.errors import RecipeError
from recipeforge.plan.hardware import hardware_for
from recipeforge.plan.world import plan_for_world

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {"pretrain": "pretrain", "sft": "sft-full", "dpo": "dpo", "grpo": "grpo"}
HARDWARE = {"cpu": {"nodes": 1, "gpus_per_node": 0}, "cuda": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-80GB"}}
BACKENDS = tuple(all_capabilities())
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

    from recipeforge.backends.artifacts import megatron_parallel_settings
    from recipeforge.plan.types import Plan

    recipe = validate_tree(_tree("megatron", "pretrain", "cuda", "none", "optimizer"))
    plan = plan_for_world(recipe, hardware=hardware_for(recipe, None))
    assert plan.offload == "optimizer"
    settings = megatron_parallel_settings(plan, recipe)["optimizer"]
    assert settings["optimizer_cpu_offload"] is True and settings["optimizer_offload_fraction"] == 1.0
    assert not megatron_parallel_settings(replace(plan, offload="none"), recipe)["optimizer"]["optimizer_cpu_offload"]
    assert capabilities_of("megatron").offload == ("none", "optimizer") and isinstance(plan, Plan)


def test_each_backend_declares_its_presets_once_and_runs_them():
    from recipeforge.capabilities import find_preset
    from recipeforge.plan.presets import get_preset

    for name, caps in all_capabilities().items():
        backend = get_backend(name)
        assert backend.capabilities is caps and tuple(backend.stages) == caps.stages
        for preset in backend.presets:
            assert preset.backend == name and preset.offload in caps.offload, preset
            assert get_preset(preset.name) == preset == get_preset(preset.name, backend=name)
            if preset.zero_stage is not None:
                assert preset.zero_stage in caps.zero_stages
        assert tuple(p.name for p in backend.presets) == caps.presets or name == "megatron"
    megatron = find_preset("tp2_pp4_offload")
    assert (megatron.backend, megatron.tensor_parallel, megatron.pipeline_parallel, megatron.offload) == \
        ("megatron", 2, 4, "optimizer")
    assert find_preset("zero33") is None and find_preset("zero3", "fsdp") is None


def test_docs_support_table_is_generated_from_the_records():
    doc = (ROOT / "docs" / "backends.md").read_text()
    assert doc == with_support_table(doc), (
        "docs/backends.md's support table is stale: run `python -m recipeforge.capabilities docs/backends.md`")
