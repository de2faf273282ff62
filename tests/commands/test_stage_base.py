"""Importing the run and stage entry points stays light, checked in a fresh interpreter (the stage
machinery: tests/unit/stages/test_stage_base.py)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_entry_points_stays_light():
    code = ("import sys, recipeforge.run, recipeforge.stages, recipeforge.stages.base, recipeforge.outputs.checkpoint;"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
