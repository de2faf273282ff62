"""The support table's generator run as docs/backends.md says (`python -m recipeforge.capabilities FILE`)
rewrites the table with every built-in backend's row, the same table the docs test compares."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_writes_the_rows_of_every_builtin_backend(tmp_path):
    doc = tmp_path / "backends.md"
    shutil.copy(ROOT / "docs" / "backends.md", doc)
    proc = subprocess.run([sys.executable, "-m", "recipeforge.capabilities", str(doc)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from recipeforge.capabilities import all_capabilities, with_support_table

    written = doc.read_text()
    for name in all_capabilities(builtin_only=True):
        assert f"| `{name}` |" in written, name
    assert written == with_support_table((ROOT / "docs" / "backends.md").read_text())
