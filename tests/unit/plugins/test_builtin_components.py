"""Built-in components through the same registries: their options schemas, the flash-attention
kernel, rollout modes, and plugin models for the planner."""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.components.kernels import apply_kernels
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

SFT = """\
stage: sft
model: {name_or_path: tiny:llama}
data:
  datasets: [{path: d.jsonl, format: alpaca}]
"""


def _problems(tmp_path, text: str) -> dict:
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "r.yaml")
    return {p.key: p for p in info.value.problems}


def test_builtin_kernel_options_are_validated(tmp_path):
    ps = _problems(tmp_path, SFT + "kernels:\n  torch_compile: {mode: fastest, backnd: inductor}\n  flash_attn: {x: 1}\n")
    assert ps["kernels.torch_compile.mode"].message.startswith("must be one of default, reduce-overhead")
    assert ps["kernels.torch_compile.backnd"].hint == "did you mean 'backend'?"
    assert ps["kernels.flash_attn.x"].hint == "this takes no options"
    assert [p.location.line for p in ps.values()] == [6, 6, 7]


def test_flash_attn_kernel_conflicts_with_another_attention(tmp_path):
    ps = _problems(tmp_path, SFT.replace("tiny:llama}", "tiny:llama, attn_implementation: sdpa}")
                   + "kernels: [flash_attn]\n")
    assert "asks for flash-attention" in ps["model.attn_implementation"].message
    (tmp_path / "ok.yaml").write_text(SFT + "kernels: [flash_attn]\n")
    assert load_recipe(tmp_path / "ok.yaml").recipe.kernels == {"flash_attn": {}}


def test_flash_attn_kernel_on_a_gpu_without_flash_attn_is_an_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with pytest.raises(RecipeError) as info:
        apply_kernels({"flash_attn": {}}, "cuda")
    (p,) = info.value.problems
    assert p.key == "kernels.flash_attn" and "recipeforge[flash]" in p.hint
    assert "needs a CUDA GPU" in apply_kernels({"flash_attn": {}}, "cpu").skipped["flash_attn"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    assert apply_kernels({"flash_attn": {}}, "cuda").enabled == ["flash_attn"]


def test_rollout_modes_and_options_of_the_hf_engine(tmp_path):
    grpo = (SFT.replace("sft", "grpo").replace("alpaca", "prompt")
            + "train: {global_batch_size: 8}\ngrpo:\n  num_generations: 4\n  rewards: [{name: length}]\n")
    ps = _problems(tmp_path, grpo + "  rollout: {engine: hf, mode: server, options: {batch: 2}}\n")
    assert ps["grpo.rollout.mode"].message == "rollout engine 'hf' has no server mode (it has colocate)"
    assert ps["grpo.rollout.options.batch"].message == "unknown key 'batch'"


def test_a_plugin_model_without_loader_sizes_the_plan(dists, tmp_path):
    from recipeforge.plan.catalog import resolve_model

    dists.add("rf-shapes", {"recipeforge.models": {"acme/private-7b": "rf_shapes:CONFIG"}}, {"rf_shapes.py": """
        CONFIG = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32}
    """}, version="0.3")
    spec, source = resolve_model("acme/private-7b", allow_hub=False)
    assert source == "plugin rf-shapes 0.3" and 6.7e9 < spec.total_params() < 6.8e9  # Llama-2-7B's shape
    with pytest.raises(RecipeError) as info:
        resolve_model("acme/private-7", allow_hub=False)
    assert "did you mean 'acme/private-7b'?" in info.value.problems[0].hint


GRPO = (SFT.replace("sft", "grpo").replace("alpaca", "prompt")
        + "train: {global_batch_size: 8}\ngrpo:\n  num_generations: 4\n  rewards: [{name: length}]\n")


def test_asynchronous_grpo_needs_an_engine_that_generates_while_the_policy_trains(tmp_path):
    ps = _problems(tmp_path, GRPO + "  max_staleness: 1\n")
    p = ps["grpo.max_staleness"]
    assert p.message == "rollout engine 'hf' cannot generate while the policy trains (asynchronous GRPO)"
    assert "grpo.max_staleness: 0" in p.hint and p.location.line == 9
    (tmp_path / "ok.yaml").write_text(GRPO + "  max_staleness: 0\n")
    assert load_recipe(tmp_path / "ok.yaml").recipe.grpo.max_staleness == 0


def test_asynchronous_grpo_follows_the_modes_an_engine_declares(tmp_path, monkeypatch):
    """Which engine mode generates concurrently is the engine's declaration, not its name."""
    from recipeforge.components.rollout import RolloutEngineSpec, rollout_arguments, rollout_engines

    monkeypatch.setattr(rollout_engines, "_entries", dict(rollout_engines._entries))
    monkeypatch.setattr(rollout_engines, "_raw", dict(rollout_engines._raw))
    rollout_engines.register("remote_gen", RolloutEngineSpec(
        "remote_gen", lambda r, o, d: {"use_vllm": False}, modes=("colocate", "server"), async_modes=("server",),
        async_arguments=lambda r, o, d, staleness: {"staleness": staleness}))
    engine = "  max_staleness: 2\n  rollout: {engine: remote_gen, mode: %s}\n"
    p = _problems(tmp_path, GRPO + engine % "colocate")["grpo.max_staleness"]
    assert p.message == "rollout engine 'remote_gen' generates while the policy trains only in server mode, not colocate"
    assert p.hint == "set grpo.rollout.mode: server, or grpo.max_staleness: 0"
    recipe = load_recipe(_write(tmp_path, GRPO + engine % "server")).recipe
    assert rollout_arguments(recipe.grpo.rollout, "cpu", max_staleness=2) == {"staleness": 2}
    assert rollout_arguments(recipe.grpo.rollout, "cpu") == {"use_vllm": False}
    with pytest.raises(RecipeError) as info:  # the run checks again (a recipe planned without the plugin)
        rollout_arguments(recipe.grpo.rollout.model_copy(update={"mode": "colocate"}), "cpu", max_staleness=1)
    assert info.value.problems[0].key == "grpo.max_staleness"
    # Tool episodes run turn by turn inside the trainer's generation step.
    ps = _problems(tmp_path, GRPO.replace("format: prompt", "format: messages")
                   + engine % "server" + "  environment: {name: calculator}\n")
    assert ps["grpo.max_staleness"].message == "multi-turn tool episodes are generated on-policy only"


def _write(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path
