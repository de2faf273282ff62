"""Shared pieces of the tests of the commands that use a finished run (serve, chat, eval, export, merge)
and of the launchers: the commands run as a user types them, in a fresh process, with a home directory
of the test's own (so a refusal that failed could never reach the real one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def recipeforge(*args: str, cwd: Path, home: Path | None = None, env: dict | None = None,
                stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`recipeforge ARGS` (``python -m recipeforge``, the same entry point) in a fresh process."""
    full = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **(env or {})}
    for name in ("RECIPEFORGE_DEBUG", "RECIPEFORGE_TRUST_CODE", "RECIPEFORGE_API_KEY"):
        if name not in (env or {}):
            full.pop(name, None)
    if home is not None:  # the caches stay where they are (the tiny tokenizer is trained once per machine)
        full.setdefault("RECIPEFORGE_CACHE", str(Path.home() / ".cache" / "recipeforge"))
        full["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], cwd=cwd, env=full, input=stdin,
                          capture_output=True, timeout=timeout)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The stderr of a refusal: exit 2, `error: ` first, every word of `words` in it, no traceback."""
    err = proc.stderr.decode(errors="backslashreplace")
    assert proc.returncode == 2, f"exit {proc.returncode}\n{err[-3000:]}"
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    assert any(line.startswith("error: ") for line in err.splitlines()), err[-3000:]
    for word in words:
        assert word in err, f"{word!r} not in:\n{err[-3000:]}"
    return err


def tree(path: Path) -> dict[str, bytes]:
    """Every file below `path` with its bytes: what a refusal must leave as it was."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}
