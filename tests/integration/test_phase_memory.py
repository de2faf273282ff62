"""The whole run's peaks, measured: a tiny LoRA run through load, training, a final evaluation, the
save and the merge writes each phase's resident peak (`phase_memory/rank0.json`), and each is at or
under the plan's host figure for that phase (plan.json `extra.phases`) within the planner's band.

On the tiny model every phase is mostly the process itself (the interpreter, torch, transformers:
`plan.phases.PROCESS_HOST_BYTES`), which this test is the measurement of."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_each_phase_peak_is_within_the_plan(tiny, tmp_path):
    run = tiny.train("sft-lora", tmp_path / "run", "train.max_steps=4", "train.eval_steps=100",
                     "output.save_steps=100", "output.merge_adapter=true", "data.val_size=8")
    from recipeforge.outputs.phase_memory import read

    measured = read(run)[0]
    plan = json.loads((run / "plan.json").read_text())
    planned = {p["phase"]: p for p in plan["extra"]["phases"]}
    from recipeforge.plan.phases import HOST_BAND as band
    assert list(planned) == ["load", "train", "eval", "save", "merge"]
    assert set(measured) == set(planned), measured
    for name, record in measured.items():
        assert record["measure"] == "vmhwm"  # the kernel's high-water mark, reset per phase
        host = record["host_gb"]
        print(f"{name}: measured {host:.3f} GB, planned {planned[name]['host_per_process_gb']:.2f} GB")
        assert 0.1 < host <= planned[name]["host_per_process_gb"] * (1 + band), (name, host, planned[name])
    assert (run / "merged").is_dir()
