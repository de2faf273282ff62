"""Reading the vision-data module imports no PIL, checked in a fresh interpreter (the rows themselves:
tests/unit/components/test_vision_data.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_reading_the_module_does_not_import_pil():
    code = ("import sys, recipeforge.components.vision_data, recipeforge.config.schema.data; "
            "assert 'PIL' not in sys.modules, 'PIL imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
