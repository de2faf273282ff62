"""QLoRA on DeepSpeed ZeRO-3 over two gloo processes, with the 4-bit base loaded shard by shard
(`backends.sharded_loading`): every 4-bit weight is a ZeRO-3 partition, the loss follows the
one-process run that loads the base whole, no process held the whole 4-bit base at any moment (each
process's own account of its live base bytes, and its resident memory growth, against the whole
base), a run resumed from its ZeRO-3 checkpoint continues the same curve, and final/ loads in peft.

The base is a local checkpoint large enough for the memory figures to stand out of the noise of a
process (a Llama of hidden size 1024, 4 layers: a 4-bit base with its 16-bit embeddings of about 28 MiB).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from sharded_loading_testing import (RECIPE, VARIANT, assert_final_adapter_loads, assert_held_half_the_base,
                                    launch_two_processes, rank_records, save_checkpoint, train_two_processes)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None
                                 or importlib.util.find_spec("bitsandbytes") is None,
                                 reason="needs deepspeed and bitsandbytes")]

# The first step, before any update: the same weights, summed in another order (bf16 4-bit layers; the
# one process's own whole load upcasts its norms to fp32). Later steps add ZeRO-3's gradient averaging
# in bf16 across the two processes (measured: at most 5.1e-3 apart over the 6 steps).
TOL_FIRST, TOL = 2e-3, 1e-2
ZERO3 = ("distributed.backend=deepspeed", "distributed.zero_stage=3")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("qlora-base") / "llama")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("qlora-zero3-sharded-loading")


@pytest.fixture(scope="module")
def runs(tiny, checkpoint, work) -> tuple[Path, Path]:
    """The same recipe twice: one process loading the base whole, and ZeRO-3 on two processes."""
    single = tiny.train(str(RECIPE), work / "single", f"model.name_or_path={checkpoint}", *VARIANT)
    return single, launch_two_processes(tiny, checkpoint, work / "zero3", *ZERO3)


def test_loss_follows_the_whole_load(tiny, runs):
    single, run = runs
    seen = json.loads((run / "backend.json").read_text())["observed"]
    assert (seen["engine"], seen["zero_stage"], seen["num_processes"]) == ("DeepSpeedEngine", 3, 2)
    # every parameter, the 4-bit base's included, is a ZeRO-3 partition of half the elements
    assert seen["local_param_elements"] * 2 == seen["full_param_elements"]
    assert seen["quantized_params"] == 28 and seen["partitioned_quantized_params"] == 28
    assert seen["quantized_local_elements"] * 2 == seen["quantized_full_elements"]
    mine, ref = tiny.values(run, "loss"), tiny.values(single, "loss")
    assert len(mine) == 6 and mine[0] == pytest.approx(ref[0], abs=TOL_FIRST), (mine, ref)
    assert mine == pytest.approx(ref, abs=TOL), (mine, ref)


def test_no_process_held_the_whole_base(runs):
    _, run = runs
    for seen in rank_records(run):  # (the FSDP test of this loader measures what a whole load holds)
        assert_held_half_the_base(seen)


def test_resumes_from_its_zero3_checkpoint(tiny, runs, checkpoint, work):
    _, run = runs
    resumed = work / "zero3-resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "checkpoint-6")
    shutil.rmtree(resumed / "final")
    proc = train_two_processes(tiny, checkpoint, resumed, work, *ZERO3)
    assert f"resuming from {resumed / 'checkpoints' / 'checkpoint-3'}" in proc.stderr
    assert [r["step"] for r in tiny.records(resumed, "train") if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert tiny.values(resumed, "loss") == pytest.approx(tiny.values(run, "loss"), abs=1e-5)


def test_final_adapter_loads_in_peft(runs, checkpoint):
    single, run = runs
    assert_final_adapter_loads(run, single, checkpoint)
