"""A stage added by a plugin (tests/fixtures/stage_plugin: `smooth_lm`) in this process: validate and plan
accept it as they accept a built-in stage, its section is checked by its own model, an unknown stage
name lists it, and the recipe schema the docs show stays the built-in stages'. Training it from the
command line: tests/integration/test_stage_plugin.py."""

from __future__ import annotations

import pytest
from plugin_testing import stage_plugin

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

RECIPE = """\
extends: {tiny}/pretrain.yaml
stage: smooth_lm
smooth_lm: {{label_smoothing: 0.2}}
"""


@pytest.fixture
def smooth_lm():
    with stage_plugin() as root:
        yield root


def _recipe(tiny, tmp_path, text: str = RECIPE):
    path = tmp_path / "smooth.yaml"
    path.write_text(text.format(tiny=tiny.recipes))
    return path


def test_validate_and_plan_accept_a_plugin_stage(smooth_lm, tiny, tmp_path):
    from recipeforge.config.validate import check_components
    from recipeforge.plan import make_plan, render_plan
    from recipeforge.plugins import annotate_plan
    from recipeforge.stage_specs import stage_spec

    loaded = load_recipe(_recipe(tiny, tmp_path))
    check_components(loaded)
    recipe = loaded.recipe
    assert recipe.stage == "smooth_lm" and recipe.smooth_lm.label_smoothing == 0.2
    assert type(recipe).__doc__ == stage_spec("smooth_lm").summary
    plan = annotate_plan(make_plan(recipe), recipe)
    assert plan.backend == "single" and plan.device == "cpu" and plan.micro_batch_size >= 1
    assert "Plan: single on cpu" in render_plan(plan)
    # The plan names the plugin the run needs, as it names a plugin reward or format.
    assert plan.extra.plugins == [{"group": "recipeforge.stages", "name": "smooth_lm", "distribution": "rf-smooth-lm",
                                   "version": "1.0"}]


def test_the_section_defaults_and_is_checked_by_the_plugin_s_model(smooth_lm, tiny, tmp_path):
    text = RECIPE.replace("smooth_lm: {{label_smoothing: 0.2}}\n", "")
    assert load_recipe(_recipe(tiny, tmp_path, text)).recipe.smooth_lm.label_smoothing == 0.1  # the model's default
    bad = RECIPE.replace("0.2}}", "1.5, warmup: 3}}")
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tiny, tmp_path, bad))
    found = {(p.key, p.location.line) for p in info.value.problems}
    assert found == {("smooth_lm.label_smoothing", 3), ("smooth_lm.warmup", 3)}, info.value.problems


def test_an_unknown_stage_lists_the_plugin_s(smooth_lm, tiny, tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tiny, tmp_path, RECIPE.replace("stage: smooth_lm", "stage: smooth_llm")))
    (p,) = info.value.problems  # the rest is checked against the closest stage: its section is known
    assert p.key == "stage" and p.location.line == 2 and p.hint == "did you mean 'smooth_lm'?"
    assert p.message.startswith("must be one of pretrain, sft,") and p.message.endswith(
        ", rloo, smooth_lm (got 'smooth_llm')")


def test_without_the_plugin_the_stage_is_unknown(builtins_only, tiny, tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tiny, tmp_path))
    stage = info.value.problems[0]
    assert stage.key == "stage" and stage.message.endswith("distill, rloo (got 'smooth_lm')"), stage.message


def test_the_documented_schema_holds_the_built_in_stages_only(smooth_lm):
    from recipeforge.config.jsonschema import recipe_json_schema
    from recipeforge.config.schema.plugin_stages import recipe_class
    from recipeforge.stage_specs import STAGES, stage_names

    assert recipe_class("smooth_lm") is not None and "smooth_lm" in stage_names()
    schema = str(recipe_json_schema())
    assert "smooth_lm" not in schema and all(f"'{s}'" in schema for s in STAGES)


def test_the_runner_and_the_backends_come_from_the_spec(smooth_lm):
    from recipeforge.capabilities import all_capabilities
    from recipeforge.stage_specs import stage_spec

    spec = stage_spec("smooth_lm")
    assert spec.runner == "rf_smooth_lm.runner:SmoothLMStage" and spec.format_kinds == ("lm",)
    caps = all_capabilities(builtin_only=True)
    # Backends running every built-in stage run a plugin's; Megatron, with its own loop, runs those it lists.
    assert caps["single"].runs_stage("smooth_lm") and caps["fsdp"].runs_stage("smooth_lm")
    assert not caps["megatron"].runs_stage("smooth_lm")


@pytest.mark.parametrize("spec, why", [
    ("object()", "a stage must be a recipeforge.stage_specs.StageSpec, got object"),
    ("StageSpec('other', 's', 'm:C', 't')", "the entry point 'odd' publishes the stage 'other'"),
    ("StageSpec('odd', 's', 'not a runner', 't')", "runner: 'not a runner' is not a Python reference"),
    ("StageSpec('odd', 's', 'm:C', 't', section='odd')", "gives both `section` and `section_model`"),
])
def test_a_malformed_stage_is_refused_at_stage(dists, tiny, tmp_path, spec, why):
    dists.add("rf-odd", {"recipeforge.stages": {"odd": "rf_odd:STAGE"}},
              {"rf_odd.py": f"from recipeforge.stage_specs import StageSpec\nSTAGE = {spec}\n"})
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tiny, tmp_path, RECIPE.replace("smooth_lm", "odd")))
    (p,) = info.value.problems
    assert p.key == "stage" and p.location.line == 2 and why in p.message, p.message


def test_a_section_named_like_a_recipe_key_is_refused(dists, tiny, tmp_path):
    dists.add("rf-odd", {"recipeforge.stages": {"odd": "rf_odd:STAGE"}}, {"rf_odd.py": """
        from pydantic import BaseModel
        from recipeforge.stage_specs import StageSpec
        class Train(BaseModel):
            x: int = 1
        STAGE = StageSpec("odd", "s", "m:C", "t", section="train", section_model=Train)
    """})
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tiny, tmp_path, "extends: {tiny}/pretrain.yaml\nstage: odd\n"))
    (p,) = info.value.problems
    assert p.key == "stage" and "section 'train', which is already a recipe key" in p.message
