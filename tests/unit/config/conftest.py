"""Helpers for recipe-language tests: write small YAML files and load them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

@pytest.fixture
def write(tmp_path: Path):
    """write("name.yaml", text) -> path; text is dedented."""
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path
    return _write
