"""The `dists` fixture: real distributions put on sys.path for one test (tests/plugin_testing.py)."""

from __future__ import annotations

import pytest
from plugin_testing import distributions


@pytest.fixture
def dists(tmp_path):
    with distributions(tmp_path) as d:
        yield d
