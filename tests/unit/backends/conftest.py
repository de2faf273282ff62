"""Recipes for the backend unit tests: the example recipes with overrides, and small built ones."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "yaml"


@pytest.fixture
def load(tmp_path):
    """load(name, *overrides) -> LoadedRecipe of examples/yaml/<name>.yaml with output.dir in tmp_path."""
    from recipeforge.config import load_recipe

    def _load(name: str, *overrides: str):
        return load_recipe(EXAMPLES / f"{name}.yaml", [f"output.dir={tmp_path / 'run'}", *overrides])

    return _load
