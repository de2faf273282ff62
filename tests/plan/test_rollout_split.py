"""The rollout side of a GRPO plan: the colocated engine's memory (bf16 weights + KV cache inside its share) and
the split of the GPUs between trainers and generation servers, with the global batch it needs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.plan import parse_hardware
from recipeforge.plan.hardware import GIB
from recipeforge.plan.world import plan_for_world

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "examples" / "yaml" / "grpo-qwen2.5-7b-gsm8k.yaml"


def _plan(hardware: str, *overrides: str, path: Path = GSM8K, cpu_ram_gb: float | None = None):
    recipe = load_recipe(path, list(overrides)).recipe
    hw = parse_hardware(hardware)
    if cpu_ram_gb is not None:
        hw = replace(hw, cpu_ram_gb=cpu_ram_gb)
    return plan_for_world(recipe, nnodes=None, nproc_per_node=None, hardware=hw)


def test_the_colocated_engine_holds_weights_and_kv_cache_in_its_share():
    plan = _plan("8xH100-80GB")
    hw = parse_hardware("8xH100-80GB")
    memory = plan.reasons["rollout_memory"]
    assert memory.value == pytest.approx(0.3 * hw.gpu_memory_gb, abs=0.01)
    weights = 7.62e9 * 2 / GIB  # Qwen2.5-7B in bf16
    assert f"weights {weights:.1f} GB (bf16)" in memory.reason
    kv = 0.3 * hw.gpu_memory_gb - weights
    assert f"KV cache {kv:.1f} GB" in memory.reason and "512+768 tokens" in memory.reason
    assert plan.memory_gb["rollout_engine"] == pytest.approx(memory.value, abs=0.01)


def test_the_split_divides_the_global_batch_and_names_the_nearest_for_more_trainers():
    split = _plan("8xH100-80GB").reasons["rollout_split"]
    # 256 completions per step divide over 4 trainers, not 7, 6 or 5: the other 4 GPUs generate.
    assert split.value == "4 train + 4 generate"
    assert "4 replicas at tensor parallel 1" in split.reason and "256 / 4 = 64" in split.reason
    assert "train.global_batch_size 224 or 280" in split.reason  # multiples of 7 trainers x 8 generations
    more = _plan("8xH100-80GB", "train.global_batch_size=224").reasons["rollout_split"]
    assert more.value == "7 train + 1 generate" and "would need" not in more.reason


def test_a_model_too_large_for_one_generation_gpu_gets_tensor_parallel_generation():
    split = _plan("8xA100-40GB", "model.name_or_path=Qwen/Qwen2.5-32B", "train.global_batch_size=192",
                  "adapter.type=lora").reasons["rollout_split"]
    assert "tensor parallel 4" in split.reason and split.value == "4 train + 4 generate"


def test_one_gpu_and_cpu_plans():
    # A 7B full GRPO run on one GPU offloads its optimizer to the host: a node with RAM for its save phase
    assert _plan("1xH100-80GB", cpu_ram_gb=256).reasons["rollout_split"].value == "-"
    cpu = _plan("cpu", path=ROOT / "examples" / "yaml" / "tiny" / "grpo.yaml")
    assert "rollout_split" not in cpu.reasons and "rollout_memory" not in cpu.reasons


def test_server_mode_books_no_engine_on_the_trainers():
    plan = _plan("8xH100-80GB", "grpo.rollout.mode=server")
    assert plan.reasons["rollout_memory"].value == 0.0 and "rollout_engine" not in plan.memory_gb
    assert "server mode" in plan.reasons["rollout_memory"].reason
