"""Code by dotted path needs an opt-in (recipe or environment) and the plan reports it; the
`recipeforge plugins` report covers every group."""

from __future__ import annotations

import pytest

from recipeforge.components.rewards import RewardContext, build_rewards
from recipeforge.config import load_recipe
from recipeforge.config.schema import RewardSpec
from recipeforge.errors import Location, RecipeError
from recipeforge.registry import GROUPS, TRUST_ENV, code_trust

GRPO = """\
stage: grpo
model: {name_or_path: tiny:llama}
hardware: {gpus_per_node: 0}
data:
  datasets: [{path: p.jsonl, format: prompt}]
train: {global_batch_size: 8, micro_batch_size: 8}
grpo:
  num_generations: 4
  rewards: [{name: "my_rewards:short"}]
"""


@pytest.fixture(autouse=True)
def no_trust_from_the_environment(monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)


def test_code_without_opt_in_fails_with_the_hint(tmp_path):
    (tmp_path / "r.yaml").write_text(GRPO)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "r.yaml")
    (p,) = info.value.problems
    assert p.key == "grpo.rewards[0].name" and p.location.line == 9
    assert "needs an opt-in" in p.message
    assert "allow_code: true" in p.hint and "--trust-code" in p.hint and f"{TRUST_ENV}=1" in p.hint


def test_opt_in_by_the_recipe_or_the_environment(tmp_path, monkeypatch):
    (tmp_path / "r.yaml").write_text(GRPO + "allow_code: true\n")
    assert load_recipe(tmp_path / "r.yaml").recipe.allow_code
    (tmp_path / "s.yaml").write_text(GRPO)
    monkeypatch.setenv(TRUST_ENV, "1")
    assert not load_recipe(tmp_path / "s.yaml").recipe.allow_code  # trusted for this run only
    assert code_trust(False) == (True, f"--trust-code ({TRUST_ENV}=1)")
    monkeypatch.setenv(TRUST_ENV, "0")
    with pytest.raises(RecipeError, match="needs an opt-in"):
        load_recipe(tmp_path / "s.yaml")


def test_a_malformed_reference_is_reported(tmp_path):
    (tmp_path / "r.yaml").write_text(GRPO.replace("my_rewards:short", "my rewards:short") + "allow_code: true\n")
    with pytest.raises(RecipeError, match="not a Python reference"):
        load_recipe(tmp_path / "r.yaml")


def test_code_next_to_the_recipe_is_imported_with_the_opt_in(tmp_path, monkeypatch):
    (tmp_path / "reward_next_to_recipe.py").write_text(
        "def short(prompts, completions, limit=3, **kw):\n    return [float(len(c) <= limit) for c in completions]\n")
    spec = [RewardSpec(name="reward_next_to_recipe:short", args={"limit": 2})]
    where = lambda path: Location(str(tmp_path / "r.yaml"), 9, 5)  # noqa: E731
    with pytest.raises(RecipeError) as info:
        build_rewards(spec, RewardContext(), locate=where)
    assert "allow_code" in info.value.problems[0].hint and info.value.problems[0].location.line == 9
    monkeypatch.setenv(TRUST_ENV, "1")
    built = build_rewards(spec, RewardContext(), locate=where)
    assert built.names == ["short"] and built.funcs[0](["p", "p"], ["ab", "abc"]) == [1.0, 0.0]
    with pytest.raises(RecipeError, match="cannot import reward 'no_such_module:f'"):
        build_rewards([RewardSpec(name="no_such_module:f")], RewardContext(), locate=where)


def test_the_plan_reports_the_opt_in_and_the_plugins_used(tmp_path, dists, monkeypatch):
    from recipeforge.plan import make_plan, render_plan
    from recipeforge.plugins import annotate_plan

    dists.add("rf-plan", {"recipeforge.rewards": {"bonus": "rf_plan:factory"}},
              {"rf_plan.py": "def factory(args, ctx):\n    return lambda p, c, **kw: [0.0] * len(c)\n"}, version="3.1")
    (tmp_path / "r.yaml").write_text(GRPO.replace('[{name: "my_rewards:short"}]', '[{name: "my_rewards:short"}, '
                                                  '{name: bonus}]') + "allow_code: true\nkernels: [liger]\n")
    recipe = load_recipe(tmp_path / "r.yaml").recipe
    plan = annotate_plan(make_plan(recipe), recipe)
    choice = plan.reasons["allow_code"]
    assert choice.value is True and choice.reason == "the recipe sets allow_code: true; imports my_rewards:short"
    assert plan.extra.plugins == [{"group": "recipeforge.rewards", "name": "bonus", "distribution": "rf-plan",
                                      "version": "3.1"}]
    assert any("recipeforge-liger plugin, which is not installed" in w for w in plan.extra.warnings)
    text = render_plan(plan)
    assert "allow_code             on               the recipe sets allow_code: true" in text
    assert "Plugins used:" in text and "bonus" in text and "rf-plan 3.1" in text
    monkeypatch.setenv(TRUST_ENV, "1")
    (tmp_path / "s.yaml").write_text(GRPO)
    recipe = load_recipe(tmp_path / "s.yaml").recipe
    assert "--trust-code" in annotate_plan(make_plan(recipe), recipe).reasons["allow_code"].reason


def test_the_report_covers_every_group(monkeypatch):
    from recipeforge.plugins import plugins_report, render_plugins

    report = plugins_report()
    assert list(report["groups"]) == list(GROUPS) == ["models", "kernels", "rollout_engines", "rewards", "environments",
                                                      "formats", "backends", "recipes", "stages"]
    g = report["groups"]
    assert g["kernels"]["group"] == "recipeforge.kernels" and g["kernels"]["builtin"] == ["flash_attn", "torch_compile"]
    assert g["formats"]["builtin"][:2] == ["text", "alpaca"] and "hf" in g["rollout_engines"]["builtin"]
    assert g["environments"]["builtin"] == ["calculator"]
    assert "meta-llama/Llama-3.1-8B" in g["models"]["builtin"]
    assert report["trust"]["allowed"] is False
    text = render_plugins()
    for kind in GROUPS:
        assert f"{kind} (recipeforge.{kind})" in text
    assert "not allowed here" in text
    monkeypatch.setenv(TRUST_ENV, "1")
    assert plugins_report()["trust"]["allowed"] and "allowed here (--trust-code" in render_plugins()
