"""`grpo.max_staleness` > 0 refused as a user types it where the rollout engine cannot generate while the
policy trains (the built-in `hf` engine generates with the policy itself): exit 2 at the key, with the fix,
no traceback; `max_staleness: 0` validates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY_GRPO = ROOT / "examples" / "yaml" / "tiny" / "grpo.yaml"


def _validate(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", "validate", str(TINY_GRPO), *overrides],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_staleness_with_an_engine_that_generates_in_process_is_refused(tmp_path):
    done = _validate(tmp_path, "grpo.max_staleness=1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "grpo.max_staleness" in done.stderr and "cannot generate while the policy trains" in done.stderr
    assert "grpo.max_staleness: 0" in done.stderr  # the hint


def test_on_policy_validates(tmp_path):
    done = _validate(tmp_path, "grpo.max_staleness=0")
    assert done.returncode == 0, done.stdout + done.stderr
