"""`Planners`: the planner chooses among the backend specs its caller hands it and sizes each layout with
the spec that offered it, never with one it looks up by name (the imports a plan really makes:
tests/commands/test_plan_imports.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import recipeforge
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.planners import Planners
from recipeforge.plan.world import plan_for_world

REPO = Path(__file__).resolve().parents[3]
PLAN = Path(recipeforge.__file__).resolve().parent / "plan"
EXAMPLES = REPO / "examples" / "yaml"


def _recipe(name: str, *overrides: str):
    return load_recipe(EXAMPLES / name, list(overrides)).recipe


def test_the_default_is_every_installed_backend():
    recipe = _recipe("llama3-70b-full-sft.yaml")
    hw = parse_hardware("2x8xH100-80GB")
    assert make_plan(recipe, hw) == make_plan(recipe, hw, Planners.installed())


def test_the_planner_chooses_only_among_the_backends_it_is_given():
    recipe = _recipe("llama3-70b-full-sft.yaml")
    hw = parse_hardware("2x8xH100-80GB")
    installed = Planners.installed()
    assert make_plan(recipe, hw).backend in ("fsdp", "deepspeed")
    replicas = Planners({name: installed[name] for name in ("single", "ddp")})
    with pytest.raises(RecipeError, match="does not fit"):
        make_plan(recipe, hw, replicas)  # 70B full fine-tuning fits no full replica per GPU
    only_zero = Planners({"deepspeed": installed["deepspeed"]})
    assert make_plan(recipe, hw, only_zero).backend == "deepspeed"


def test_a_layout_is_sized_by_the_spec_that_offered_it():
    """A spec handed in under a built-in name (as a plugin or a test would) decides the micro batch, and
    the plan's traits are its own: nothing is looked up again by name."""
    installed = Planners.installed()
    base = type(installed["fsdp"])

    class OneRowFsdp(base):
        fixed_micro_batch = 1

    recipe = _recipe("llama3-70b-full-sft.yaml", "distributed.backend=fsdp", "train.micro_batch_size=auto")
    hw = parse_hardware("2x8xH100-80GB")
    assert make_plan(recipe, hw).micro_batch_size > 1
    planners = Planners({**installed, "fsdp": OneRowFsdp()})
    plan = make_plan(recipe, hw, planners)
    assert plan.backend == "fsdp" and plan.micro_batch_size == 1


def test_a_cpu_job_spreads_with_the_given_planners():
    recipe = _recipe("tiny/sft-full.yaml", "distributed.backend=deepspeed", "distributed.zero_stage=3",
                     "train.micro_batch_size=auto")
    installed = Planners.installed()
    plan = plan_for_world(recipe, nproc_per_node=2, hardware=parse_hardware("cpu"), planners=installed)
    assert plan.backend == "deepspeed" and plan.world_size == 2
    with pytest.raises(RecipeError, match="unknown backend 'deepspeed'"):
        plan_for_world(recipe, nproc_per_node=2, hardware=parse_hardware("cpu"),
                       planners=Planners({"ddp": installed["ddp"]}))


def test_a_hand_built_layout_names_its_spec():
    from recipeforge.plan.memory import Layout

    with pytest.raises(TypeError, match="planner="):
        _ = Layout("fsdp", None).label
    bound = Planners.installed().bind(Layout("fsdp", None, tensor_parallel=2))
    assert bound.label == "fsdp tp2" and bound == Layout("fsdp", None, tensor_parallel=2)


def test_only_planners_py_reaches_the_backend_registry():
    found = []
    for path in sorted(PLAN.rglob("*.py")):
        if path.name == "planners.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # registry_for("backends"), and capabilities' lookups of every backend or one by name
            if (isinstance(node, ast.Constant) and node.value == "backends") or \
               (isinstance(node, ast.Name) and node.id in ("backend_specs", "all_capabilities", "capabilities_of")):
                found.append(f"plan/{path.relative_to(PLAN)}:{node.lineno}")
    assert found == [], "take the planners the caller passed: " + ", ".join(found)
