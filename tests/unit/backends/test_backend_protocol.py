"""The backends registry, the protocol checks, and the worker helpers that need no process group."""

from __future__ import annotations

from dataclasses import replace

import pytest

from recipeforge.backends import backends, get_backend
from recipeforge.backends.base import Backend
from recipeforge.plan.world import plan_for_world
from recipeforge.backends.worker import on_main
from recipeforge.errors import RecipeError
from recipeforge.plan import make_plan
from recipeforge.stages.base import DistInfo


def test_builtins_are_registered_like_plugins():
    assert backends.builtin_names() == ["single", "ddp", "deepspeed", "fsdp", "megatron"]
    for name in backends.builtin_names():
        entry = backends.entry(name)
        assert entry.source == "recipeforge" and isinstance(entry.obj, Backend) and entry.obj.name == name
    with pytest.raises(RecipeError) as err:
        get_backend("zero")
    assert "unknown backend 'zero'" in str(err.value) and "deepspeed" in err.value.problems[0].hint


def test_a_plugin_backend_must_implement_the_protocol():
    from recipeforge.backends import _as_backend
    from recipeforge.backends.ddp import DDPBackend

    class Incomplete:
        name = "half"

    with pytest.raises(TypeError, match="lacks .*save_final"):
        _as_backend("half", Incomplete)

    class Custom(DDPBackend):
        name = "custom"

    assert _as_backend("custom", Custom).name == "custom"


def test_each_backend_checks_the_plan(load):
    recipe = load("tiny/sft-full", "train.micro_batch_size=auto").recipe
    single = make_plan(recipe)
    get_backend("single").check(single, recipe)
    with pytest.raises(RecipeError, match="uses backend single, not ddp"):
        get_backend("ddp").check(single, recipe)
    ddp = plan_for_world(recipe, nproc_per_node=2)
    assert get_backend("ddp").launcher(ddp) == "accelerate" and get_backend("single").launcher(single) == "none"
    # FSDP2 runs on the CPU; what it cannot do there (offload) is refused by the planner already, and
    # by the backend for a plan made elsewhere.
    fsdp_recipe = load("tiny/sft-full", "train.micro_batch_size=auto", "distributed.backend=fsdp").recipe
    fsdp = plan_for_world(fsdp_recipe, nproc_per_node=2)
    assert (fsdp.backend, fsdp.preset, fsdp.backend_part.sharding, fsdp.world_size) == ("fsdp", "fsdp_full_shard",
                                                                                       "full_shard", 2)
    get_backend("fsdp").check(fsdp, fsdp_recipe)
    assert get_backend("fsdp").launcher(fsdp) == "accelerate"
    with pytest.raises(RecipeError, match="cannot offload optimizer\\+params on the CPU"):
        get_backend("fsdp").check(replace(fsdp, preset="fsdp_full_shard_offload", offload="optimizer+params"),
                                  fsdp_recipe)


def test_deepspeed_offload_needs_adam(load):
    pins = ("tiny/sft-full", "train.micro_batch_size=auto", "distributed.backend=deepspeed",
            "distributed.preset=zero2_offload")
    with pytest.raises(RecipeError, match="cannot be offloaded") as err:  # validate knows the preset's offload
        load(*pins, "train.optimizer=sgd")
    assert err.value.problems[0].key == "train.optimizer"
    adam = load(*pins).recipe
    recipe = adam.model_copy(update={"train": adam.train.model_copy(update={"optimizer": "sgd"})})
    with pytest.raises(RecipeError, match="cannot be offloaded") as err:  # and so does the planner
        plan_for_world(recipe, nproc_per_node=2)
    assert err.value.problems[0].key == "train.optimizer"
    planned = plan_for_world(adam, nproc_per_node=2)
    with pytest.raises(RecipeError, match="cannot be offloaded") as err:
        get_backend("deepspeed").check(planned, recipe)
    assert err.value.problems[0].key == "train.optimizer"


def test_on_main_without_a_process_group():
    assert on_main(lambda: 41 + 1, DistInfo()) == 42
    with pytest.raises(RecipeError, match="boom"):
        on_main(lambda: (_ for _ in ()).throw(RecipeError("boom")), DistInfo())
