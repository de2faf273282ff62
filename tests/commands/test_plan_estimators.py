"""The planner's ports of DeepSpeed's memory estimators against the installed DeepSpeed, imported in a
process of its own (the published figures: tests/unit/plan/test_plan_estimators.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from recipeforge.plan.estimators import deepspeed_zero2_mem_needs, deepspeed_zero3_mem_needs


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_ports_match_the_installed_deepspeed():
    # Runs in a subprocess: importing deepspeed must not leak into the other tests' sys.modules.
    code = """
import itertools, json
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
rows = []
for p, big, g, n in itertools.product((1.2e9, 7.6e9, 70.5e9), (2e8, 1.05e9), (1, 8), (1, 4)):
    for off in (True, False):
        rows.append(["z2", p, big, g, n, off, False, True, list(z2(p, g, n, off))])
        for offp in ((True, False) if off else (False,)):
            for init in (True, False):
                rows.append(["z3", p, big, g, n, off, offp, init, list(z3(p, big, g, n, off, offp, init))])
print(json.dumps(rows))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) > 50
    for kind, p, big, g, n, off, offp, init, expected in rows:
        if kind == "z2":
            assert list(deepspeed_zero2_mem_needs(p, g, n, off)) == expected
        else:
            assert list(deepspeed_zero3_mem_needs(p, big, g, n, off, offp, init)) == expected
