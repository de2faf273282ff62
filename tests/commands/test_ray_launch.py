"""`launch --ray --dry-run` imports neither Ray nor torch, checked in a fresh interpreter (the launcher's
rules: tests/unit/backends/test_ray_launch.py; the launch itself: tests/integration/backends/test_ray_launch_cpu.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIG = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"   # hardware: 2 nodes x 8 H100


def test_dry_run_imports_neither_ray_nor_torch(tmp_path):
    code = (f"import sys; from recipeforge.cli import main; "
            f"rc = main(['launch', '--ray', {str(BIG)!r}, 'output.dir={tmp_path / 'run'}', '--dry-run']); "
            "heavy = [m for m in ('ray', 'torch', 'transformers') if m in sys.modules]; "
            "assert rc == 0 and not heavy, (rc, heavy)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
