"""`Plan.traits`: what the rest of a run needs to know of the plan's backend is decided with the plan, by the
backend that runs it (the spreading backend of a CPU job of several processes), decided again the same way
from plan.json, and read from the plan by the stages, the run's checks and the plan's text, which never look
a backend up by its name."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

import recipeforge
from recipeforge.backends.worker import plan_from_dict
from recipeforge.config import load_recipe
from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.planners import Planners
from recipeforge.plan.types import BackendTraits
from recipeforge.plan.world import plan_for_world

REPO = Path(__file__).resolve().parents[3]
PACKAGE = Path(recipeforge.__file__).resolve().parent
CASES = [("llama3-8b-full-sft.yaml", "1xH100-80GB"), ("llama3-70b-full-sft.yaml", "2x8xH100-80GB"),
         ("qlora-70b.yaml", "2xA100-80GB"), ("llama3-70b-sft-tp-fsdp.yaml", "2x8xH100-80GB"),
         ("pretrain-llama3-405b.yaml", "8x8xH100-80GB"), ("dpo-llama3-8b-lora.yaml", "1xA100-80GB")]


@pytest.mark.parametrize(("name", "hardware"), CASES)
def test_a_plan_carries_its_backends_traits_and_plan_json_gives_them_back(name, hardware):
    recipe = load_recipe(REPO / "examples" / "yaml" / name).recipe
    plan = make_plan(recipe, parse_hardware(hardware))
    assert plan.traits == Planners.installed().spec(plan.backend).traits(plan)
    raw = plan.to_dict()
    assert "traits" not in raw  # plan.json is what it was
    assert plan_from_dict(raw).traits == plan.traits


def test_a_sharding_backend_says_so_in_its_plan():
    recipe = load_recipe(REPO / "examples" / "yaml" / "qlora-70b.yaml",
                         ["distributed.backend=fsdp"]).recipe
    plan = make_plan(recipe, parse_hardware("2xA100-80GB"))
    assert plan.backend == "fsdp" and plan.traits.shards_weights


def test_a_cpu_job_of_several_processes_takes_the_spreading_backends_traits():
    recipe = load_recipe(REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml",
                         ["distributed.backend=deepspeed", "distributed.zero_stage=3",
                          "train.micro_batch_size=auto"]).recipe
    plan = plan_for_world(recipe, nproc_per_node=2, hardware=parse_hardware("cpu"))
    assert plan.backend == "deepspeed" and plan.world_size == 2
    assert plan.traits == Planners.installed().spec("deepspeed").traits(plan) and plan.traits.shards_weights
    assert not plan.traits.trainer_holds_weights


def test_traits_do_not_make_two_plans_differ():
    plan = make_plan(load_recipe(REPO / "examples" / "yaml" / "llama3-8b-full-sft.yaml").recipe,
                     parse_hardware("1xH100-80GB"))
    assert replace(plan, traits=BackendTraits(shards_weights=True)) == plan


@pytest.mark.parametrize("folder", ["stages", "outputs"])
def test_stages_and_outputs_never_look_a_backend_up_by_name(folder):
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # registry_for("backends").get(name), or the planners' spec(name)
            if (isinstance(node, ast.Constant) and node.value == "backends") or \
               (isinstance(node, ast.Attribute) and node.attr in ("spec", "installed")
                    and isinstance(node.value, ast.Name) and node.value.id in ("planners", "Planners")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == [], "read the plan's traits instead: " + ", ".join(found)
