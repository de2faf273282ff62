"""The planner's mixture-of-experts terms: the experts implementation, the expert-parallel search and
its memory terms, what LoRA adapts, and the layouts refused at their key."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_testing import build_recipe

from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan, parse_hardware
from recipeforge.plan.expert_lora import expert_lora_linears
from recipeforge.plan.catalog import resolve_model

ROOT = Path(__file__).resolve().parents[2]
A3B = "Qwen/Qwen3-30B-A3B"


def plan(recipe, spec):
    return make_plan(recipe, parse_hardware(spec))


@pytest.fixture
def recipe():
    """recipe(model, stage, **sections) -> validated Recipe."""
    return build_recipe


def test_example_on_8_h100_searches_expert_parallel_and_prints_the_terms():
    p = make_plan(load_recipe(ROOT / "examples" / "yaml" / "qwen3-30b-a3b-lora.yaml").recipe,
                  parse_hardware("8xH100-80GB"))
    ep, mem = p.reasons["expert_parallel"], p.reasons["expert_memory"]
    assert p.reasons["experts"].value == "grouped_mm"
    # every size that divides 128 experts and the node's 8 GPUs was weighed
    for size in (1, 2, 4, 8):
        assert f"{size}: " in ep.reason or f"EP {size}:" in ep.reason, ep.reason
    for term in ("experts per rank", "gathered per layer", "router", "all-to-all", "imbalance headroom"):
        assert term in mem.reason and term in ep.reason
    assert p.reasons["moe_lora"].value == "attention+experts"


def test_auto_keeps_every_expert_for_an_adapter_run(recipe):
    r = recipe(A3B, adapter={"type": "lora", "dropout": 0.0},
               distributed={"backend": "fsdp", "expert_parallel": "auto"})
    ep = plan(r, "8xH100-80GB").reasons["expert_parallel"]
    assert ep.value == 1 and "adapter run keeps every expert" in ep.reason and "EP 8" in ep.reason


def test_auto_on_fsdp_picks_the_least_traffic_that_fits(recipe):
    r = recipe(A3B, distributed={"backend": "fsdp", "expert_parallel": "auto"})  # a full fine-tune
    p = plan(r, "8xH200-141GB")
    assert p.reasons["expert_parallel"].value == 8  # 16 experts per rank, nothing gathered across the node
    assert "16 experts per rank" in p.reasons["expert_memory"].reason
    # fewer GPUs per node: the search stops at the node
    p4 = plan(r, "4xH200-141GB")
    assert p4.reasons["expert_parallel"].value == 4


def test_expert_terms_scale_with_the_size(recipe):
    import re

    r = recipe(A3B, adapter={"type": "lora", "dropout": 0.0}, distributed={"backend": "fsdp", "expert_parallel": 2})
    two = plan(r, "8xH100-80GB").reasons["expert_memory"].reason
    r8 = recipe(A3B, adapter={"type": "lora", "dropout": 0.0}, distributed={"backend": "fsdp", "expert_parallel": 8})
    eight = plan(r8, "8xH100-80GB").reasons["expert_memory"].reason

    def term(text, name):
        return float(re.search(rf"([\d.]+) GB {name}", text).group(1))

    # one layer's gathered experts shrink with the size: 64 -> 16 experts of 3 x 2048 x 768 bf16 (x2 prefetch)
    assert term(two, "gathered per layer") == pytest.approx(2 * 64 * 3 * 2048 * 768 * 2 / 2**30, abs=0.01)
    assert term(eight, "gathered per layer") == pytest.approx(2 * 16 * 3 * 2048 * 768 * 2 / 2**30, abs=0.01)
    assert term(eight, "moved per step") < term(two, "moved per step")


def test_dense_backend_keeps_one_and_says_why(recipe):
    p = plan(recipe(A3B, adapter={"type": "lora", "dropout": 0.0}), "8xH100-80GB")
    assert p.backend != "fsdp" and p.reasons["expert_parallel"].value == 1
    assert "composes with FSDP2" in p.reasons["expert_parallel"].reason


def test_lora_counts_the_expert_adapters(recipe):
    spec, _ = resolve_model(A3B)
    assert {lin.name for lin in expert_lora_linears(spec)} >= {"experts.down_proj"}
    with_experts = plan(recipe(A3B, adapter={"type": "lora", "dropout": 0.0}), "8xH100-80GB")
    attention_only = plan(recipe(A3B, adapter={"type": "lora"}), "8xH100-80GB")  # dropout 0.05: not adapted
    assert attention_only.reasons["moe_lora"].value == "attention"
    assert "adapter.dropout" in attention_only.reasons["moe_lora"].reason
    assert with_experts.extra.model["trainable_params"] > 10 * attention_only.extra.model["trainable_params"]


EXAMPLE_235B = ROOT / "examples" / "yaml" / "qwen3-235b-a22b-full-ep.yaml"


def test_full_235b_on_four_nodes_is_refused_naming_what_is_short():
    with pytest.raises(RecipeError) as err:
        make_plan(load_recipe(EXAMPLE_235B, ["hardware.nodes=4"]).recipe)
    text = str(err.value)
    assert "235" in text and "GB short" in text and "8x8xH100-80GB" in text


def test_full_235b_on_eight_nodes_plans_expert_parallel():
    p = make_plan(load_recipe(EXAMPLE_235B).recipe)
    assert p.backend == "fsdp" and p.reasons["expert_parallel"].value == 8
    assert "16 experts per rank" in p.reasons["expert_memory"].reason


@pytest.mark.parametrize(("sections", "hardware", "key", "fix"), [
    ({"distributed": {"backend": "fsdp", "expert_parallel": 3}}, "8xH100-80GB", "distributed.expert_parallel",
     "use one of"),
    ({"distributed": {"backend": "fsdp", "expert_parallel": 16}}, "8xH100-80GB", "distributed.expert_parallel",
     "use one of"),
    ({"adapter": {"type": "lora", "dropout": 0.0}, "distributed": {"backend": "auto", "expert_parallel": 8}},
     "8xH100-80GB", "distributed.expert_parallel", "distributed.backend: fsdp"),
    ({"adapter": {"type": "lora", "dropout": 0.1}, "moe": {"lora_experts": True}}, "8xH100-80GB", "adapter.dropout",
     "adapter.dropout: 0"),
])
def test_layouts_that_cannot_run_are_refused_at_their_key(recipe, sections, hardware, key, fix):
    with pytest.raises(RecipeError) as err:
        plan(recipe(A3B, **sections), hardware)
    problem = err.value.problems[0]
    assert problem.key == key and fix in (problem.hint or ""), (problem.key, problem.message, problem.hint)


def test_a_dense_model_has_no_experts_to_split(recipe):
    with pytest.raises(RecipeError, match="no routed experts"):
        plan(recipe("Qwen/Qwen3-8B", distributed={"backend": "fsdp", "expert_parallel": 2}), "8xH100-80GB")
    assert "experts" not in plan(recipe("Qwen/Qwen3-8B"), "8xH100-80GB").reasons


def test_tiny_moe_on_the_cpu_runs_grouped_experts_without_expert_parallel():
    r = build_recipe("tiny:qwen3_moe", adapter={"type": "lora", "dropout": 0.0}, hardware={"gpus_per_node": 0})
    p = make_plan(r)
    assert p.reasons["experts"].value == "grouped_mm" and p.reasons["expert_parallel"].value == 1


@pytest.mark.parametrize(("overrides", "fix"), [
    (["distributed.backend=ddp", "distributed.expert_parallel=2"], "distributed.backend: fsdp"),
    (["distributed.expert_parallel=2", "distributed.pipeline_parallel=2"], "pipeline_parallel: 1"),
])
def test_validate_refuses_what_no_backend_record_runs(overrides, fix):
    from recipeforge.config import load_recipe as load

    with pytest.raises(RecipeError) as err:
        load(ROOT / "examples" / "yaml" / "qwen3-30b-a3b-lora.yaml", overrides)
    problems = [p for p in err.value.problems if p.key == "distributed.expert_parallel"]
    assert problems and fix in (problems[0].hint or ""), [(p.key, p.message) for p in err.value.problems]


FULL = ["adapter.type=none", "output.merge_adapter=false"]


def test_validate_takes_expert_parallel_on_the_cpu():
    """The fsdp backend's record lists expert_parallel among its CPU sizes: a CPU-only recipe validates."""
    loaded = load_recipe(ROOT / "examples" / "yaml" / "tiny" / "moe-lora.yaml", [*FULL, "distributed.expert_parallel=2"])
    assert loaded.recipe.distributed.expert_parallel == 2


@pytest.mark.parametrize(("overrides", "said", "fix"), [
    ([*FULL, "distributed.expert_parallel=3"], "8 experts per MoE layer", "[2, 4, 8]"),
    (["distributed.expert_parallel=2"], "LoRA on the routed experts", "adapter.type: none"),
    (["distributed.expert_parallel=2", "moe.lora_experts=false"], "trains full fine-tunes", "adapter.type: none"),
    ([*FULL, "distributed.expert_parallel=2", "distributed.backend=deepspeed"], "not the deepspeed backend",
     "distributed.backend: fsdp"),
    ([*FULL, "distributed.expert_parallel=2", "model.name_or_path=tiny:llama"], "no routed experts",
     "expert_parallel: 1"),
])
def test_validate_refuses_expert_parallel_that_cannot_run(overrides, said, fix):
    with pytest.raises(RecipeError) as err:
        load_recipe(ROOT / "examples" / "yaml" / "tiny" / "moe-lora.yaml", overrides)
    problems = [p for p in err.value.problems if p.key == "distributed.expert_parallel"]
    assert problems and said in problems[0].message and fix in (problems[0].hint or ""), \
        [(p.key, p.message) for p in err.value.problems]


def test_cpu_plan_spreads_the_experts_over_the_processes():
    from recipeforge.plan.world import plan_for_world

    r = load_recipe(ROOT / "examples" / "yaml" / "tiny" / "moe-lora.yaml",
                    [*FULL, "distributed.expert_parallel=2", "distributed.backend=fsdp",
                     "train.micro_batch_size=auto"]).recipe
    p = plan_for_world(r, nproc_per_node=2)
    assert (p.backend, p.world_size, p.data_parallel) == ("fsdp", 2, 2)
    assert p.reasons["expert_parallel"].value == 2 and "4 of the 8 experts" in p.reasons["expert_parallel"].reason
    for nproc, fix in ((None, "--nproc-per-node 2"), (3, "--nproc-per-node 2")):
        with pytest.raises(RecipeError) as err:
            plan_for_world(r, nproc_per_node=nproc)
        problem = err.value.problems[0]
        assert problem.key == "distributed.expert_parallel" and fix in (problem.hint or "")


def test_expert_lora_merged_weights_are_counted_and_warned_about():
    import re

    p = make_plan(load_recipe(ROOT / "examples" / "yaml" / "qwen3-30b-a3b-lora.yaml").recipe,
                  parse_hardware("8xH100-80GB"))
    mem = p.reasons["expert_memory"].reason
    merged = float(re.search(r"expert LoRA merged weights ([\d.]+) GB", mem).group(1))
    # peft builds W + B@A for one layer's 128 experts (bf16 merged + fp32 product), one layer kept (recomputation)
    assert p.gradient_checkpointing
    assert merged == pytest.approx(128 * 3 * 2048 * 768 * (2 + 4) / 2**30, abs=0.01)
    peak = float(mem.rsplit("peak with it ", 1)[1].split(" GB")[0])
    over = [w for w in p.extra.warnings if "expert_memory" in w]
    assert (peak > p.extra.memory_limit_gb) == bool(over)
    assert not over or "moe.lora_experts: false" in over[0]


def test_attention_only_lora_has_no_merged_expert_term(recipe):
    p = plan(recipe(A3B, adapter={"type": "lora"}), "8xH100-80GB")
    assert "merged" not in p.reasons["expert_memory"].reason
