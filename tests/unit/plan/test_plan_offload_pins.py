"""`distributed.offload`: auto offloads only when needed, none forbids it; host RAM from the recipe."""

import pytest

from recipeforge.errors import RecipeError
from recipeforge.plan import hardware_for, make_plan, parse_hardware


def test_auto_offloads_only_when_nothing_fits(recipe):
    r = recipe("meta-llama/Llama-3.1-70B", train={"global_batch_size": 64})
    plan = make_plan(r, parse_hardware("2x8xH100-80GB"))
    assert plan.offload != "none"
    small = make_plan(recipe("meta-llama/Llama-3.1-8B", train={"global_batch_size": 64}),
                      parse_hardware("8xH100-80GB"))
    assert small.offload == "none"


def test_none_forbids_offload(recipe):
    r = recipe("meta-llama/Llama-3.1-70B", train={"global_batch_size": 64}, distributed={"offload": "none"})
    # 16 bytes of states per parameter over 8 GPUs: 140 GB each, beyond any band of the estimate
    with pytest.raises(RecipeError) as exc:
        make_plan(r, parse_hardware("1x8xH100-80GB"))
    assert "does not fit" in exc.value.problems[0].message


def test_recipe_host_ram_reaches_the_plan(recipe):
    r = recipe("tiny:llama", hardware={"nodes": 1, "gpus_per_node": 1, "gpu": "H100-80GB", "cpu_ram_gb": 512})
    hw = hardware_for(r, None)
    assert hw.host_ram_gb() == (512, True)
