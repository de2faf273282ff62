"""recipeforge-liger: the kernel registers through its entry point, its options are validated with
located errors, it stays off on CPU, and on a GPU it turns into transformers' Liger arguments.

Needs the plugin installed (``pip install plugins/recipeforge-liger``); the `gpu` tests also need
CUDA and liger-kernel.
"""

from __future__ import annotations

import importlib.util

import pytest

from recipeforge.components.kernels import apply_kernels, kernels
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

SFT = """\
stage: sft
model: {name_or_path: tiny:llama}
data:
  datasets: [{path: data.jsonl, format: alpaca}]
"""


def _recipe(tmp_path, kernels_yaml: str):
    path = tmp_path / "r.yaml"
    path.write_text(SFT + kernels_yaml)
    return load_recipe(path)


def _problems(tmp_path, kernels_yaml: str) -> dict:
    with pytest.raises(RecipeError) as info:
        _recipe(tmp_path, kernels_yaml)
    return {p.key: p for p in info.value.problems}


def test_registered_by_its_entry_point():
    entry = kernels.entry("liger")
    assert entry.source == "recipeforge-liger" and entry.version == "0.1.0"
    assert entry.obj.gpu_only and entry.obj.options.__name__ == "LigerOptions"
    assert "liger" in kernels.names() and kernels.first_party_plugin("liger") is None


def test_options_are_validated_where_they_are_written(tmp_path):
    ps = _problems(tmp_path, "kernels:\n  liger: {swiglo: true, rope: maybe}\n")
    assert ps["kernels.liger.swiglo"].message == "unknown key 'swiglo'"
    assert ps["kernels.liger.swiglo"].hint == "did you mean 'swiglu'?"
    assert ps["kernels.liger.rope"].message.startswith("expected true or false")
    assert ps["kernels.liger.swiglo"].location.line == 6


def test_both_losses_are_refused(tmp_path):
    ps = _problems(tmp_path, "kernels:\n  liger: {cross_entropy: true, fused_linear_cross_entropy: true}\n")
    assert "cannot both be on" in ps["kernels.liger"].message


def test_valid_options_load(tmp_path):
    recipe = _recipe(tmp_path, "kernels:\n  liger: {fused_linear_cross_entropy: true, rope: false}\n").recipe
    assert recipe.kernels["liger"] == {"fused_linear_cross_entropy": True, "rope": False}
    assert _recipe(tmp_path, "kernels: [liger]\n").recipe.kernels == {"liger": {}}


def test_skipped_on_cpu():
    notes = []
    effects = apply_kernels({"liger": {"rope": True}}, "cpu", log=notes.append)
    assert effects.enabled == [] and "GPUs only" in effects.skipped["liger"] and len(notes) == 1


def test_gpu_without_liger_kernel_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    with pytest.raises(RecipeError) as info:
        apply_kernels({"liger": {}}, "cuda")
    assert info.value.problems[0].key == "kernels.liger"
    assert "recipeforge-liger[kernels]" in info.value.problems[0].hint


def test_gpu_arguments_are_transformers_liger_arguments(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "liger_kernel" else real(name, *a))
    effects = apply_kernels({"liger": {"fused_linear_cross_entropy": True, "swiglu": False}}, "cuda")
    assert effects.enabled == ["liger"]
    assert effects.trainer_kwargs == {"use_liger_kernel": True,
                                      "liger_kernel_config": {"fused_linear_cross_entropy": True, "swiglu": False}}
    assert apply_kernels({"liger": {}}, "cuda").trainer_kwargs == {"use_liger_kernel": True}
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", use_cpu=True, **effects.trainer_kwargs)
    assert args.use_liger_kernel and args.liger_kernel_config["fused_linear_cross_entropy"] is True


def test_planner_counts_the_fused_loss(tmp_path):
    from recipeforge.plan import make_plan
    from recipeforge.plan.hardware import hardware_for

    # the same micro batch and recomputation in both (the planner may choose differently for each)
    base = (SFT.replace("tiny:llama", "meta-llama/Llama-3.1-8B") + "adapter: {type: lora}\n"
            + "train: {micro_batch_size: 4, gradient_checkpointing: true}\n")
    plain, fused = (tmp_path / "plain.yaml"), (tmp_path / "fused.yaml")
    plain.write_text(base)
    fused.write_text(base + "kernels: [liger]\n")
    hw = hardware_for(load_recipe(plain).recipe, "1xH100-80GB")
    p1, p2 = make_plan(load_recipe(plain).recipe, hw), make_plan(load_recipe(fused).recipe, hw)
    # The fused loss never materializes the logits: less at the loss, and a lower peak overall (the
    # train phase's peak may move to a layer's backward, where no logits are alive at all).
    assert p2.memory_gb.get("logits", 0.0) < p1.memory_gb["logits"]
    assert p2.memory_gb["total"] < p1.memory_gb["total"]


@pytest.mark.gpu
def test_liger_forward_matches_the_reference_on_gpu():
    pytest.importorskip("liger_kernel")
    import torch
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    from recipeforge.components.models import build_tiny_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer(1024)
    ids = torch.randint(0, 1024, (2, 64), device="cuda")
    losses = []
    for patch in (False, True):
        model = build_tiny_model("llama", tok, seed=0, dtype=torch.float32, attn_implementation="sdpa").cuda()
        if patch:
            _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True)
        losses.append(model(input_ids=ids, labels=ids).loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-3)


@pytest.mark.gpu
def test_sft_trains_with_liger_on_gpu(tmp_path):
    pytest.importorskip("liger_kernel")
    import json

    from recipeforge.run import train

    rows = [{"instruction": f"Say {w}", "output": w} for w in ("moo", "woof", "meow", "baa")] * 8
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(SFT + "hardware: {gpus_per_node: 1, gpu: H100-80GB}\nkernels:\n  liger: {rope: true}\n"
                      "train: {max_steps: 4, global_batch_size: 8, learning_rate: 3.0e-3, logging_steps: 1}\n"
                      f"output: {{dir: {tmp_path / 'run'}}}\nlogging: {{progress_bar: false}}\n")
    run = train(load_recipe(recipe), overwrite=True)
    assert (run / "final").is_dir()
