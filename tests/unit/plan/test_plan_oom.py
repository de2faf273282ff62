"""Out of memory at run time is answered with the plan's numbers and layouts that would fit.

The planner is asked again with its estimate scaled by how far off it was; what it then picks must
fit the device once scaled the same way.
"""

from __future__ import annotations

import re

from recipeforge.plan import make_plan
from recipeforge.plan.hardware import GIB
from recipeforge.plan.oom import OutOfMemory, explain_oom

LLAMA_8B = "meta-llama/Llama-3.1-8B"


def _one_gpu(gpu: str) -> dict:
    return {"nodes": 1, "gpus_per_node": 1, "gpu": gpu}


def test_underestimate_is_answered_with_a_stricter_headroom_that_fits(recipe):
    r = recipe(LLAMA_8B, train={"global_batch_size": 16}, hardware=_one_gpu("H100-80GB"),
               adapter={"type": "lora"})
    plan = make_plan(r)
    estimate = plan.memory_gb["total"]
    capacity = 79.6
    peak = estimate * 1.4  # the run needed 40% more than planned
    err = explain_oom(r, plan, step=12, capacity_bytes=capacity * GIB, peak_bytes=peak * GIB,
                      checkpoint="checkpoints/checkpoint-10")
    assert isinstance(err, OutOfMemory)
    (problem,) = err.problems
    assert problem.message.startswith(f"out of GPU memory at step 12: the plan estimated {estimate:.1f} GB per GPU "
                                      f"(weights {plan.memory_gb['weights']:.1f}, ")
    assert f"the run needed more than {max(capacity, peak):.1f} GB" in problem.message
    assert "assumed" not in problem.message  # the plan's GPU is the one that ran
    assert problem.hint.startswith("what would fit: distributed.memory_headroom: ")
    assert problem.hint.endswith("Complete checkpoints are kept (checkpoints/checkpoint-10): change the recipe and "
                                 "rerun with --force to continue")
    headroom = float(re.search(r"memory_headroom: ([\d.]+)", problem.hint).group(1))
    assert headroom < r.distributed.memory_headroom
    # Following the advice: the new plan, off by the same factor, fits the GPU.
    fixed = r.model_copy(update={"distributed": r.distributed.model_copy(update={"memory_headroom": headroom})})
    new = make_plan(fixed)
    assert new.memory_gb["total"] * (max(capacity, peak) / estimate) <= capacity
    assert f"{new.memory_gb['total']:.1f} GB estimated" in problem.hint


def test_pinned_micro_batch_gets_an_unpinned_option(recipe):
    r = recipe(LLAMA_8B, train={"global_batch_size": 16, "micro_batch_size": 4, "gradient_checkpointing": False},
               hardware=_one_gpu("H100-80GB"), adapter={"type": "lora"}, data={"sequence_len": 1024})
    plan = make_plan(r)
    assert plan.micro_batch_size == 4
    err = explain_oom(r, plan, step=3, capacity_bytes=79.6 * GIB, peak_bytes=plan.memory_gb["total"] * 1.5 * GIB)
    hint = err.problems[0].hint
    assert "train.micro_batch_size: auto, train.gradient_checkpointing: auto" in hint
    smaller = int(re.search(r"or set train.micro_batch_size: (\d+) directly", hint).group(1))
    assert smaller < 4
    assert hint.endswith("No checkpoint was written yet: change the recipe and rerun")


def test_plan_for_another_gpu_names_the_gpu_it_ran_on(recipe):
    r = recipe(LLAMA_8B, train={"global_batch_size": 32}, hardware=_one_gpu("H200-141GB"),
               adapter={"type": "lora"})
    plan = make_plan(r)
    err = explain_oom(r, plan, step=None, capacity_bytes=79.6 * GIB, peak_bytes=80.5 * GIB)
    (problem,) = err.problems
    assert problem.message.startswith("out of GPU memory before training started")
    assert ("the plan assumed 140.4 GB GPUs (from the recipe's hardware: section) and this GPU has 79.6 GB"
            in problem.message)
    assert problem.hint.startswith("what would fit: hardware.gpu: H100-80GB")


def test_nothing_fits_passes_on_the_planners_alternatives(recipe):
    r = recipe(LLAMA_8B, train={"global_batch_size": 8}, hardware=_one_gpu("H200-141GB"),
               distributed={"backend": "single"})
    plan = make_plan(r)
    err = explain_oom(r, plan, step=1, capacity_bytes=22.5 * GIB, peak_bytes=23 * GIB)
    hint = err.problems[0].hint
    assert hint.startswith("what would fit: with hardware.gpu: L4-24GB, distributed.memory_headroom: ")
    assert "nothing fits this recipe as it is" in hint
    assert "adapter.type: qlora fits" in hint
