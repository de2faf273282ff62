"""The registries with real entry points: lazy loading, distributions and versions, clashes, broken
plugins, and the located errors a recipe gets for names nobody registered (in fresh
interpreters: tests/commands/test_registry_entry_points.py)."""

from __future__ import annotations

import sys

import pytest

from recipeforge.components.formats import formats
from recipeforge.components.kernels import KernelSpec, apply_kernels, kernels
from recipeforge.components.rewards import rewards
from recipeforge.config import load_recipe
from recipeforge.config.validate import check_components
from recipeforge.errors import RecipeError
from recipeforge.registry import Registry

REWARD_MODULE = """
import pathlib
IMPORTED = True

def factory(args, ctx):
    return lambda prompts, completions, **kw: [1.0] * len(completions)
"""

GRPO = """\
stage: grpo
model: {name_or_path: tiny:llama}
data:
  datasets: [{path: p.jsonl, format: prompt}]
train: {global_batch_size: 8}
grpo:
  num_generations: 4
"""


def _problems(path) -> dict:
    with pytest.raises(RecipeError) as info:
        check_components(load_recipe(path))
    return {p.key: p for p in info.value.problems}


def test_builtins_register_exactly_like_plugins(dists):
    dists.add("rf-demo", {"recipeforge.rewards": {"always_one": "rf_demo_rewards:factory"}},
              {"rf_demo_rewards.py": REWARD_MODULE}, version="2.5")
    builtin, plugin = rewards.entry("length"), rewards.entry("always_one")
    assert (builtin.source, plugin.source, plugin.version) == ("recipeforge", "rf-demo", "2.5")
    assert callable(builtin.obj) and callable(plugin.obj)
    assert rewards.names()[:5] == ["accuracy", "exact_match", "length", "regex", "reward_model"]
    assert "always_one" in rewards.names()[5:]  # plugins after the built-ins


def test_entry_points_are_imported_only_when_a_recipe_names_them(dists, tmp_path):
    dists.add("rf-lazy", {"recipeforge.rewards": {"lazy_reward": "rf_lazy_rewards:factory"}},
              {"rf_lazy_rewards.py": REWARD_MODULE})
    (tmp_path / "a.yaml").write_text(GRPO + "  rewards: [{name: length, args: {target: 3}}]\n")
    check_components(load_recipe(tmp_path / "a.yaml"))
    assert "lazy_reward" in rewards.names()  # listed from its entry point ...
    assert "rf_lazy_rewards" not in sys.modules  # ... without importing it
    (tmp_path / "b.yaml").write_text(GRPO + "  rewards: [{name: lazy_reward}]\n")
    check_components(load_recipe(tmp_path / "b.yaml"))
    assert sys.modules["rf_lazy_rewards"].IMPORTED


def test_two_distributions_with_one_name_is_an_error_naming_both(dists, tmp_path):
    dists.add("rf-alpha", {"recipeforge.rewards": {"twin": "rf_alpha:factory"}}, {"rf_alpha.py": REWARD_MODULE})
    dists.add("rf-beta", {"recipeforge.rewards": {"twin": "rf_beta:factory"}}, {"rf_beta.py": REWARD_MODULE})
    with pytest.raises(RecipeError) as info:
        rewards.get("twin")
    assert "rf-alpha" in str(info.value) and "rf-beta" in str(info.value)
    (tmp_path / "r.yaml").write_text(GRPO + "  rewards: [{name: twin}]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "r.yaml")
    (p,) = info.value.problems
    assert p.key == "grpo.rewards[0].name" and "rf-alpha, rf-beta" in p.message and p.location.line == 8


def test_registering_one_name_twice_names_both_sources():
    reg: Registry = Registry("widgets")
    reg.register("w", object())
    reg.register("same", len)
    reg.register("same", len)  # the same object again is harmless
    with pytest.raises(RecipeError, match="registered twice: by recipeforge and by other-dist"):
        reg.register("w", object(), source="other-dist")


def test_a_plugin_cannot_take_a_builtin_name(dists):
    from recipeforge.plugins import plugins_report

    dists.add("rf-shadow", {"recipeforge.rewards": {"length": "rf_shadow:factory"}}, {"rf_shadow.py": REWARD_MODULE})
    (row,) = [r for r in plugins_report()["groups"]["rewards"]["plugins"] if r["distribution"] == "rf-shadow"]
    assert row["status"] == "failed" and "clashes with the built-in reward 'length'" in row["error"]
    assert rewards.entry("length").source == "recipeforge" and "rf_shadow" not in sys.modules


def test_a_broken_plugin_is_reported_and_the_others_still_load(dists, tmp_path):
    from recipeforge.plugins import plugins_report, render_plugins

    dists.add("rf-broken", {"recipeforge.rewards": {"broken": "rf_broken_rewards:factory"},
                            "recipeforge.formats": {"not_a_format": "rf_broken_formats:VALUE"}},
              {"rf_broken_rewards.py": "import a_module_that_does_not_exist\n",
               "rf_broken_formats.py": "VALUE = 'a string, not a Format'\n"})
    dists.add("rf-good", {"recipeforge.rewards": {"good": "rf_good:factory"}}, {"rf_good.py": REWARD_MODULE})
    rows = {r["name"]: r for r in plugins_report()["groups"]["rewards"]["plugins"]}
    assert rows["broken"]["status"] == "failed" and "a_module_that_does_not_exist" in rows["broken"]["error"]
    assert rows["good"]["status"] == "loaded" and rows["good"]["distribution"] == "rf-good"
    (fmt,) = [r for r in plugins_report()["groups"]["formats"]["plugins"] if r["distribution"] == "rf-broken"]
    assert fmt["status"] == "failed" and "a format must be" in fmt["error"]
    text = render_plugins()
    assert "FAILED: ModuleNotFoundError: No module named 'a_module_that_does_not_exist'" in text
    assert "good" in text and "rf-good 1.0  loaded" in text and "2 plugin entries failed to load" in text
    # A recipe naming the broken one fails at its key; one naming the good one works.
    (tmp_path / "bad.yaml").write_text(GRPO + "  rewards: [{name: broken}]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "bad.yaml")
    (p,) = info.value.problems
    assert p.key == "grpo.rewards[0].name" and "from plugin rf-broken failed to load" in p.message
    (tmp_path / "good.yaml").write_text(GRPO + "  rewards: [{name: good}]\n")
    check_components(load_recipe(tmp_path / "good.yaml"))


def test_unknown_components_are_located_and_list_what_is_available(dists, tmp_path):
    dists.add("rf-names", {"recipeforge.rewards": {"plugin_reward": "rf_names:factory"}},
              {"rf_names.py": REWARD_MODULE})
    (tmp_path / "r.yaml").write_text(GRPO + "  rewards: [{name: lenght}, {name: plugin_rewrd}]\n")
    ps = _problems(tmp_path / "r.yaml")
    assert ps["grpo.rewards[0].name"].message == "unknown reward 'lenght'"
    hint = ps["grpo.rewards[0].name"].hint
    assert hint.startswith("did you mean 'length'? available: accuracy, exact_match, length, regex, reward_model, ")
    assert "plugin_reward" in hint
    assert ps["grpo.rewards[1].name"].hint.startswith("did you mean 'plugin_reward'?")
    assert ps["grpo.rewards[1].name"].location.line == 8
    (tmp_path / "k.yaml").write_text(GRPO.replace("format: prompt", "format: promt")
                                     + "  rewards: [{name: length}]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "k.yaml")
    (p,) = info.value.problems
    assert p.key == "data.datasets[0].format" and p.hint == "did you mean 'prompt'?"
    assert p.message.startswith("must be one of text, alpaca, messages, completion, segments, tokenized, "
                                "preference, unpaired, prompt")
    assert p.message.endswith("(got 'promt')")
    (tmp_path / "e.yaml").write_text(GRPO + "  rewards: [{name: length}]\n  rollout: {engine: vlm}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "e.yaml")
    (p,) = info.value.problems
    assert (p.key, p.message, p.location.line) == ("grpo.rollout.engine", "unknown rollout engine 'vlm'", 9)
    assert p.hint == "did you mean 'vllm'? available: hf; with a plugin: vllm (pip install recipeforge-vllm)"


def test_a_plugin_format_declares_the_stages_it_feeds(dists, tmp_path):
    dists.add("rf-fmt", {"recipeforge.formats": {"qa_rows": "rf_fmt:QA"}}, {"rf_fmt.py": """
        from recipeforge.components.formats import Format
        QA = Format("qa_rows", "prompt", ("question",), lambda row, opts: {**row, "prompt": row["question"]})
    """})
    (tmp_path / "sft.yaml").write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\n"
                                       "data:\n  datasets: [{path: d.jsonl, format: qa_rows}]\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "sft.yaml")
    (p,) = info.value.problems
    assert p.message == "stage 'sft' cannot train on format 'qa_rows'" and p.location.line == 4
    assert formats.entry("qa_rows").source == "rf-fmt"


def test_kernel_plugins_extend_the_schema_with_their_own_options(dists, tmp_path):
    dists.add("rf-kernel", {"recipeforge.kernels": {"fast_norm": "rf_kernel:SPEC"}}, {"rf_kernel.py": """
        from typing import Literal
        from recipeforge.components.kernels import KernelSpec
        from recipeforge.config.schema.base import Section

        class Options(Section):
            width: int = 8
            mode: Literal["fast", "exact"] = "fast"

        SPEC = KernelSpec("fast_norm", lambda options, device: ({"fast_norm_width": options.width}, None), Options)
    """})
    (tmp_path / "r.yaml").write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\n"
                                     "data:\n  datasets: [{path: d.jsonl, format: alpaca}]\n"
                                     "kernels:\n  fast_norm: {widht: 4, mode: quick}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "r.yaml")
    ps = {p.key: p for p in info.value.problems}
    assert ps["kernels.fast_norm.widht"].hint == "did you mean 'width'?"
    assert ps["kernels.fast_norm.mode"].message == "must be one of fast, exact (got 'quick')"
    assert {p.location.line for p in ps.values()} == {6}
    (tmp_path / "r.yaml").write_text((tmp_path / "r.yaml").read_text().replace("widht: 4, mode: quick", "width: 4"))
    recipe = load_recipe(tmp_path / "r.yaml").recipe
    assert apply_kernels(recipe.kernels, "cpu").trainer_kwargs == {"fast_norm_width": 4}
    assert isinstance(kernels.get("fast_norm"), KernelSpec)


def test_first_party_plugins_can_be_named_before_they_are_installed(builtins_only):
    # liger (recipeforge-liger): validates and plans anywhere; skipped on CPU; a GPU run says what to install.
    notes = []
    assert apply_kernels({"liger": {}}, "cpu", log=notes.append).skipped["liger"].endswith(
        "its plugin recipeforge-liger is not installed)")
    with pytest.raises(RecipeError) as info:
        apply_kernels({"liger": {}}, "cuda")
    assert info.value.problems[0].hint.startswith("pip install recipeforge-liger")


def test_asking_for_an_undeclared_kind_is_an_error():
    from recipeforge.registry import registry_for

    with pytest.raises(KeyError, match="no registry of kind 'widgets'"):
        registry_for("widgets")
