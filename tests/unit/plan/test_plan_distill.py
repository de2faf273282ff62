"""The distillation teacher in the planner: a colocated teacher's weights, forward and top-k on every
GPU (whole, in the compute dtype or 4-bit), a served one costing nothing, the layout it changes, its
lines in the plan and plan.json, on-policy generation, and the megatron backend refusing the stage."""

from __future__ import annotations

import json

import pytest

from recipeforge.backends.worker import plan_from_dict
from recipeforge.capabilities import capabilities_of, refusals
from recipeforge.config.schema import recipe_adapter
from recipeforge.errors import RecipeError
from recipeforge.plan.catalog import KNOWN_CONFIGS
from recipeforge.plan.hardware import GIB, parse_hardware
from recipeforge.plan.linear import quantized_bytes_per_param
from recipeforge.plan.models import spec_from_config
from recipeforge.plan.plan import make_plan
from recipeforge.plan.planners import Planners
from recipeforge.plan.render import render_plan
from recipeforge.plan.workload import build_workload

STUDENT = "Qwen/Qwen2.5-0.5B"
H100 = parse_hardware("1xH100-80GB")
# A Qwen2.5-3B-shaped teacher written as a local model directory's config.json
TEACHER_CONFIG = {**KNOWN_CONFIGS["Qwen/Qwen2.5-3B"], "architectures": ["Qwen2ForCausalLM"]}


def recipe(teacher: dict, model: str = STUDENT, seq: int = 1024, **sections):
    raw = {"stage": "distill", "model": {"name_or_path": model},
           "data": {"datasets": [{"path": "rows.jsonl", "format": "alpaca"}], "sequence_len": seq},
           "distill": {"teacher": teacher, **sections.pop("distill", {})},
           "train": {"global_batch_size": 8, "micro_batch_size": 2, "gradient_checkpointing": True,
                     **sections.pop("train", {})},
           **sections}
    return recipe_adapter().validate_python(raw)


@pytest.fixture
def teacher_dir(tmp_path):
    path = tmp_path / "teacher"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TEACHER_CONFIG))
    return path


def single(r):
    return make_plan(r.model_copy(update={"distributed": r.distributed.model_copy(update={"backend": "single"})}), H100)


def test_a_colocated_teacher_costs_each_gpu_its_weights_over_a_served_one(teacher_dir):
    served = single(recipe({"url": "http://127.0.0.1:8000/v1"}))
    colocated = single(recipe({"name_or_path": str(teacher_dir)}))
    teacher = spec_from_config(TEACHER_CONFIG)
    weights = teacher.total_params() * 2  # bf16, whole on the one GPU
    assert colocated.memory_gb["teacher_model"] == pytest.approx(weights / GIB, abs=0.01)
    # the same layout and step; the difference is the weights, plus at most the teacher's forward
    # (its own phase, counted where it is the peak) and its top-k targets (alive in the student's step)
    assert (colocated.micro_batch_size, colocated.gradient_checkpointing) == (2, True)
    forward = 2 * 1024 * (teacher.vocab_size * (2 + 4) + 4096 * 8)  # logits + log_softmax + a generous layer
    extra = colocated.memory_gb["total"] - served.memory_gb["total"]
    assert weights / GIB - 0.02 <= extra <= (weights + forward) / GIB + 0.02
    assert "teacher_model" not in served.memory_gb and "teacher_forward" not in served.memory_gb
    assert served.reasons["teacher"].value == "served"
    assert "nothing of it is held on the training GPUs" in served.reasons["teacher"].reason
    assert str(teacher_dir / "config.json") in colocated.reasons["teacher"].reason


def test_a_4bit_teacher_costs_less_than_a_bf16_one(teacher_dir):
    bf16 = single(recipe({"name_or_path": str(teacher_dir)}))
    nf4 = single(recipe({"name_or_path": str(teacher_dir), "load_in_4bit": True}))
    m = spec_from_config(TEACHER_CONFIG)
    q = m.quantized_params()
    expected = q * quantized_bytes_per_param(4, True, m.hidden_size) + (m.total_params() - q) * 2
    assert nf4.memory_gb["teacher_model"] == pytest.approx(expected / GIB, abs=0.01)
    assert nf4.memory_gb["teacher_model"] < bf16.memory_gb["teacher_model"] / 2
    assert nf4.memory_gb["total"] < bf16.memory_gb["total"]
    assert "4-bit NF4" in nf4.reasons["teacher"].reason


def test_the_teacher_changes_the_layout_or_the_plan_refuses_with_what_would_fit():
    student, teacher, hw = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", parse_hardware("8xH100-80GB")
    unpinned = {"micro_batch_size": "auto", "gradient_checkpointing": "auto", "global_batch_size": 32}
    served = make_plan(recipe({"url": "http://teacher:8000/v1"}, student, 2048, train=unpinned), hw)
    nf4 = make_plan(recipe({"name_or_path": teacher, "load_in_4bit": True}, student, 2048, train=unpinned), hw)
    assert (served.backend, served.preset) == ("fsdp", "fsdp_shard_grad_op")
    # 37 GB of 4-bit teacher on every GPU: the gradients and weights must be sharded too
    assert (nf4.backend, nf4.preset) == ("fsdp", "fsdp_full_shard")
    assert nf4.extra.teacher["weights_gb"] > 35
    with pytest.raises(RecipeError) as err:  # 141 GB of bf16 teacher fits no H100
        make_plan(recipe({"name_or_path": teacher}, student, 2048, train=unpinned), hw)
    message = str(err.value)
    assert "with a colocated 70.55B teacher whole on every GPU does not fit" in message
    assert "distill.teacher.load_in_4bit: true fits (fsdp fsdp_full_shard" in message
    assert "a served teacher (distill.teacher.url" in message


def test_plan_json_carries_the_teacher_and_other_stages_json_has_no_such_key(teacher_dir):
    plan = single(recipe({"name_or_path": str(teacher_dir)}))
    raw = json.loads(json.dumps(plan.to_dict()))
    t = raw["extra"]["teacher"]
    assert t["colocated"] is True and t["params"] == spec_from_config(TEACHER_CONFIG).total_params()
    assert t["per_gpu_gb"] == pytest.approx(t["weights_gb"] + t["forward_gb"] + t["topk_gb"], abs=0.02)
    assert raw["memory_gb"]["teacher_model"] == t["weights_gb"]
    assert plan_from_dict(raw).extra.teacher == t  # plan.json round-trips
    sft = make_plan(recipe_adapter().validate_python(
        {"stage": "sft", "model": {"name_or_path": STUDENT},
         "data": {"datasets": [{"path": "rows.jsonl", "format": "alpaca"}]}}), H100)
    assert "teacher" not in sft.to_dict()["extra"] and "teacher" not in sft.reasons
    assert plan_from_dict(json.loads(json.dumps(sft.to_dict()))).extra.teacher == {}


def test_the_plan_text_shows_the_teacher_with_its_gb_per_gpu(teacher_dir):
    plan = single(recipe({"name_or_path": str(teacher_dir)}))
    text = render_plan(plan)
    assert "teacher weights (whole on each GPU)" in text and "teacher forward (no gradients)" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("teacher ") and "GB/GPU" in ln)
    assert f"{plan.extra.teacher['per_gpu_gb']:.2f} GB/GPU" in line
    assert "replicated, not sharded" in line


def test_an_unknown_teacher_is_sized_like_the_student_and_a_run_dir_by_its_final(tmp_path):
    unknown = build_workload(recipe({"name_or_path": "someone/unpublished-teacher"}),
                             spec_from_config(KNOWN_CONFIGS[STUDENT], STUDENT), H100, Planners.installed())
    assert unknown.teacher is not None and unknown.teacher.model is not None
    assert unknown.teacher.model.total_params() == unknown.model.total_params()
    assert any("teacher is sized like the student" in n for n in unknown.notes)
    run = tmp_path / "teacher-run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text(json.dumps(TEACHER_CONFIG))
    plan = single(recipe({"name_or_path": str(run)}))
    assert plan.extra.teacher["params"] == spec_from_config(TEACHER_CONFIG).total_params()
    assert plan.extra.teacher["source"].endswith("final/config.json")


def test_a_teacher_with_another_vocabulary_is_noted(tmp_path):
    path = tmp_path / "llama-teacher"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(KNOWN_CONFIGS["meta-llama/Llama-3.2-1B"]))
    plan = single(recipe({"name_or_path": str(path)}))
    assert any("same tokenizer" in w for w in plan.extra.warnings)


def test_on_policy_steps_add_the_students_generation_at_the_micro_batch():
    r = recipe({"url": "http://teacher:8000/v1"}, distill={"on_policy": 0.5, "max_new_tokens": 256},
               train={"global_batch_size": 16, "micro_batch_size": 2})
    plan = single(r)
    m = spec_from_config(KNOWN_CONFIGS[STUDENT])
    kv = 2 * (1024 + 256) * m.num_layers * 2 * m.kv_dim * 2  # micro batch 2, not 2 x accumulation 8
    assert plan.gradient_accumulation == 8
    assert plan.memory_gb["kv_cache"] == pytest.approx(kv / GIB, abs=0.01)
    assert plan.extra.sequence_len == 1024 + 256
    assert any("on-policy distillation steps are sized at 1280 tokens" in w for w in plan.extra.warnings)


def test_liger_fused_cross_entropy_does_not_shrink_the_distillation_logits():
    r = recipe({"url": "http://teacher:8000/v1"}, kernels={"liger": {"fused_linear_cross_entropy": True}})
    w = build_workload(r, spec_from_config(KNOWN_CONFIGS[STUDENT], STUDENT), H100, Planners.installed())
    assert w.fused_loss is False and any("fused linear cross-entropy" in n for n in w.notes)


def test_megatron_refuses_distillation_with_its_reason():
    found = refusals(capabilities_of("megatron"), stage="distill")
    assert found and "not distill" in found[0].message and "distillation" in found[0].message
    with pytest.raises(RecipeError, match="not distill"):
        make_plan(recipe({"url": "http://teacher:8000/v1"}, "meta-llama/Llama-3.1-8B",
                         distributed={"backend": "megatron"}), parse_hardware("8xH100-80GB"))
