"""`recipeforge train --dry-run` and `launch --slurm` import no torch, checked in a fresh interpreter (the
commands they print: tests/unit/backends/test_launch_dry_run.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "yaml" / "llama3-70b-full-sft.yaml"   # hardware: 2 nodes x 8 H100


def test_dry_run_and_slurm_script_import_no_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from recipeforge.cli import main
        assert main(["train", {str(RECIPE)!r}, "output.dir={tmp_path / 'a'}", "--dry-run", "--nnodes", "2",
                     "--node-rank", "0", "--master-addr", "h0"]) == 0
        assert main(["launch", "--slurm", {str(RECIPE)!r}, "output.dir={tmp_path / 'b'}"]) == 0
        heavy = sorted(m for m in ("torch", "transformers", "accelerate", "deepspeed") if m in sys.modules)
        assert not heavy, heavy
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
