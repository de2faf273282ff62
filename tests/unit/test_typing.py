"""The typed boundaries of a run pass `mypy --strict` (the files and settings are in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_run_boundaries_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy is a dev dependency (pip install -e '.[dev]')")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
