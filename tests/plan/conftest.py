"""The calibration bench (bench/plan_calibration.py) for the tests that score the planner against
published figures: loaded once, under the module name its dataclasses look themselves up by."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "plan_calibration.py"


@pytest.fixture(scope="session")
def calibration():
    if "plan_calibration" not in sys.modules:
        spec = importlib.util.spec_from_file_location("plan_calibration", BENCH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["plan_calibration"]
