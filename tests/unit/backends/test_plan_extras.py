"""`Plan.extra` is typed (`PlanExtras`): what the planner records is what the backends read, and plan.json
round-trips. Two keys used to miss each other: the FSDP plugin settings carried a
``mixed_precision_policy`` nothing read, and the fsdp backend read an ``fsdp_sharding`` nothing wrote."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, replace
from types import SimpleNamespace

import pytest

from recipeforge.backends import get_backend
from recipeforge.backends.worker import plan_from_dict
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan
from recipeforge.backends.artifacts import fsdp_plugin_config
from recipeforge.plan.hardware import parse_hardware
from recipeforge.plan.types import PlanExtras
from recipeforge.plan.world import plan_for_world


def _fsdp_plan(load, sharding: str):
    recipe = load("tiny/sft-full", "train.micro_batch_size=auto", "distributed.backend=fsdp",
                  f"distributed.fsdp_sharding={sharding}", "hardware.nodes=2", "hardware.gpus_per_node=8",
                  "hardware.gpu=H100-80GB", "train.global_batch_size=16").recipe
    return make_plan(recipe, parse_hardware("2x8xH100-80GB")), recipe


@pytest.mark.parametrize("sharding", ["full_shard", "shard_grad_op", "hybrid_shard"])
def test_the_sharding_the_plan_chose_is_the_one_that_runs(load, sharding):
    plan, recipe = _fsdp_plan(load, sharding)
    assert plan.backend_part.sharding == sharding
    # what the launch and every worker read: the plan.json form
    plan = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert plan.to_dict()["backend_part"]["sharding"] == sharding
    section = get_backend("fsdp").accelerate_config(plan, recipe, run_dir=None)
    assert section["fsdp_config"]["fsdp_reshard_after_forward"] is (sharding != "shard_grad_op")
    assert ("parallelism_config" in section) is (sharding == "hybrid_shard")
    if sharding == "hybrid_shard":
        assert section["parallelism_config"] == {"parallelism_config_dp_replicate_size": 2,
                                                 "parallelism_config_dp_shard_size": 8}


class _Recording(dict):
    """The plugin settings, remembering which keys a reader looked at."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def test_every_fsdp_setting_the_plan_writes_is_read_by_the_backend(load, monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan, recipe = _fsdp_plan(load, "hybrid_shard")
    written = fsdp_plugin_config(plan, recipe)
    plugin_fields = FullyShardedDataParallelPlugin.__dataclass_fields__
    assert not set(written) - set(plugin_fields), "not a FullyShardedDataParallelPlugin argument"
    backend = get_backend("fsdp")
    recorded = _Recording(written)
    monkeypatch.setattr(type(backend), "plugin", lambda self, p, r: recorded)
    backend.accelerate_config(plan, recipe, run_dir=None)
    backend.trainer_kwargs(SimpleNamespace(plan=plan, recipe=recipe))
    assert recorded.read == set(written) - {"fsdp_version"}, f"written, never read: {set(written) - recorded.read}"


def test_plan_json_round_trips(load):
    for plan in (plan_for_world(load("tiny/sft-full", "train.micro_batch_size=auto").recipe, nproc_per_node=2),
                 _fsdp_plan(load, "full_shard")[0]):
        raw = json.loads(json.dumps(plan.to_dict()))
        again = plan_from_dict(raw)
        assert isinstance(again.extra, PlanExtras)
        assert again.to_dict() == raw


def test_extras_are_fields_not_a_bag():
    extras = PlanExtras(dtype="bf16")
    with pytest.raises(FrozenInstanceError):
        extras.dtype = "fp16"  # type: ignore[misc]
    with pytest.raises(TypeError):
        PlanExtras(mixed_precision_policy="bf16")  # type: ignore[call-arg]
    assert not hasattr(extras, "get") and not hasattr(extras, "__getitem__")  # no string-keyed access
    with pytest.raises(AttributeError):
        extras.fsdp_shard  # type: ignore[attr-defined]  # a misspelt field fails where it is read
    assert extras.dtype == "bf16" and not hasattr(extras, "fsdp_sharding")  # FSDP's own part holds it
    with pytest.raises(RecipeError, match="unknown keys: bogus"):
        PlanExtras.from_dict({"dtype": "bf16", "bogus": 1})
    assert replace(extras, processes_per_node=2).processes_per_node == 2


def test_each_backend_reads_its_own_typed_part_of_the_plan():
    from recipeforge.backends.deepspeed import ZeroPart
    from recipeforge.backends.fsdp import FSDPPart
    from recipeforge.config import load_recipe
    from recipeforge.plan.types import BackendPart

    for backend, kind in (("deepspeed", ZeroPart), ("fsdp", FSDPPart), ("ddp", BackendPart)):
        recipe = load_recipe("examples/yaml/dpo-llama3-8b-lora.yaml", [f"distributed.backend={backend}"]).recipe
        plan = make_plan(recipe, parse_hardware("8xH100-80GB"))
        assert type(plan.backend_part) is kind
        again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))  # as a worker reads plan.json
        assert again.backend_part == plan.backend_part and again == plan
    raw = plan.to_dict()
    raw["backend_part"] = {"zero_stage": 3}  # DeepSpeed's field in a DDP plan
    with pytest.raises(RecipeError, match="backend ddp does not know: zero_stage"):
        plan_from_dict(raw)
