"""Fixtures the command tests share with the unit tests they were split from: the planner's `recipe`
(tests/plan_testing.py) and `dists`, real distributions on sys.path (tests/plugin_testing.py)."""

from __future__ import annotations

import pytest
from plan_testing import build_recipe
from plugin_testing import distributions


@pytest.fixture
def recipe():
    """recipe(model, stage, **sections) -> validated Recipe."""
    return build_recipe


@pytest.fixture
def dists(tmp_path):
    with distributions(tmp_path) as d:
        yield d
