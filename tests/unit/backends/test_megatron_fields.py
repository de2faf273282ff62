"""Every recipe field says what the megatron backend does with it; refusals name the field."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from recipeforge.config.schema.megatron_fields import FIELDS, entry, megatron_problems


def _models(annotation) -> list[type]:
    """Pydantic models inside an annotation (Optional[X], tuple[X, ...], Union[...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def schema_paths() -> set[str]:
    """Every leaf field path (a field holding no section of its own) of every stage's recipe class."""
    from recipeforge.config.schema import STAGE_CLASSES

    classes = STAGE_CLASSES.values() if isinstance(STAGE_CLASSES, dict) else STAGE_CLASSES
    out: set[str] = set()

    def walk(cls, prefix):
        for name, info in cls.model_fields.items():
            models = _models(info.annotation)
            if not models:
                out.add(prefix + name)
            for model in models:
                walk(model, f"{prefix}{name}.")

    for cls in classes:
        walk(cls, "")
    return out


def test_every_schema_field_is_mapped_refused_or_ignored():
    paths = schema_paths()
    assert {"train.optimizer", "adapter.quant.bits", "logging.wandb.tags", "dpo.beta"} <= paths  # the walk is deep
    missing = sorted(p for p in paths if entry(p) is None)
    assert not missing, f"recipe fields with no megatron entry in config/schema/megatron_fields.py: {missing}"
    stale = sorted(k for k in FIELDS if not any(p == k or p.startswith(k + ".") for p in paths))
    assert not stale, f"entries for fields the schema no longer has: {stale}"
    for key, field in FIELDS.items():
        assert field.kind in ("mapped", "refused", "ignored"), key
        assert field.target or field.why, key
        if field.kind == "refused" or field.allowed:
            assert field.why, key


def test_the_defaults_of_a_megatron_recipe_raise_nothing(load):
    assert megatron_problems(load("pretrain-llama3-405b").recipe) == []


@pytest.mark.parametrize("override,key,words", [
    ("train.optimizer=adamw_8bit", "train.optimizer", "Adam/AdamW and SGD"),
    ("train.optimizer=adafactor", "train.optimizer", "single, ddp, deepspeed and fsdp"),
    ("distributed.offload=optimizer+params", "distributed.offload", "not parameters"),
    ("model.attn_implementation=sdpa", "model.attn_implementation", "Transformer Engine"),
    ("output.resume=never", None, None),
    ("output.resume=/some/checkpoint", "output.resume", "named checkpoint"),
    ("data.shuffle=false", "data.shuffle", "shuffles"),
    ("model.max_position_embeddings=4096", "model.max_position_embeddings", "context length"),
    ("train.divergence.on_spike=stop", "train.divergence.on_spike", "callback"),
    ("kernels={liger: {}}", "kernels", "Transformer Engine"),
    ("train.micro_batch_size=4", "train.micro_batch_size", "one per micro batch"),
    ("train.micro_batch_size=1", None, None),
    ("train.optimizer=sgd", None, None),
])
def test_refusals_name_the_key_and_the_reason(load, override, key, words):
    problems = megatron_problems(load("pretrain-llama3-405b", override).recipe)
    if key is None:
        assert problems == []
        return
    assert [k for k, _ in problems] == [key]
    assert words in problems[0][1] and key in problems[0][1]


def test_lora_extras_are_refused(load):
    recipe = load("tiny/sft-lora", "train.micro_batch_size=auto").recipe  # modules_to_save: [lm_head]
    assert [k for k, _ in megatron_problems(recipe)] == ["adapter.modules_to_save"]
    # a combination the validation rules already stop for deepspeed, built directly for megatron
    base = load("tiny/sft-lora", "adapter.use_rslora=true").recipe
    both = base.model_copy(update={"train": base.train.model_copy(update={"optimizer": "sgd"}),
                                   "distributed": base.distributed.model_copy(update={"offload": "optimizer"})})
    assert {k for k, _ in megatron_problems(both)} >= {"adapter.use_rslora", "distributed.offload",
                                                        "train.micro_batch_size"}


def test_megatron_recomputes_as_the_plan_checkpoints():
    """Full, selective and every-N-th-layer checkpointing as Megatron's recompute settings."""

    from types import SimpleNamespace

    from recipeforge.backends.artifacts import megatron_recompute

    plan = SimpleNamespace(gradient_checkpointing=True, checkpoint_mode="full", checkpoint_every=1,
                           pipeline_parallel=2, extra=SimpleNamespace(model={"layers": 32}))
    assert megatron_recompute(plan) == {"recompute_granularity": "full", "recompute_method": "uniform",
                                        "recompute_num_layers": 1}
    plan.checkpoint_mode = "selective"
    assert megatron_recompute(plan)["recompute_granularity"] == "selective"
    plan.checkpoint_mode, plan.checkpoint_every = "full", 4
    # 16 layers per pipeline stage, every 4th checkpointed: the first 4 of each stage recomputed
    assert megatron_recompute(plan) == {"recompute_granularity": "full", "recompute_method": "block",
                                        "recompute_num_layers": 4}
    plan.gradient_checkpointing = False
    assert megatron_recompute(plan)["recompute_granularity"] is None
