"""The planner tests' `recipe` fixture: recipes built from small dicts (tests/plan_testing.py)."""

from __future__ import annotations

import pytest
from plan_testing import build_recipe


@pytest.fixture
def recipe():
    """recipe(model, stage, **sections) -> validated Recipe."""
    return build_recipe
