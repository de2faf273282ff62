"""Fixtures for the plugin tests: real distributions (a `.dist-info` with METADATA and
entry_points.txt, next to their modules) put on sys.path for one test, so importlib.metadata finds
their entry points exactly as it finds pip-installed ones."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest


class Distributions:
    """Writes distributions into a directory that is on sys.path for the test."""

    def __init__(self, root: Path):
        self.root = root
        self.modules: list[str] = []

    def add(self, name: str, entry_points: dict[str, dict[str, str]], modules: dict[str, str] | None = None,
            version: str = "1.0") -> None:
        """A distribution `name` publishing `entry_points` ({group: {name: value}}) and shipping
        `modules` ({"pkg/mod.py": source})."""
        from recipeforge.registry import refresh_entry_points

        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in entry_points.items()))
        for rel, source in (modules or {}).items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
            self.modules.append(rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__"))
        refresh_entry_points()


@pytest.fixture
def dists(tmp_path):
    """`dists.add(...)` installs a distribution for this test only; the registries forget it after."""
    from recipeforge.registry import refresh_entry_points

    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    d = Distributions(root)
    try:
        yield d
    finally:
        sys.path.remove(str(root))
        for name in d.modules:
            sys.modules.pop(name, None)
        refresh_entry_points()
