"""Shared pieces of the hostile-input tests: a valid recipe, running the CLI in-process or as a real
process, and the checks every refusal must pass (exit 2, located first line, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from recipeforge.cli import main

OK = """\
stage: sft
model:
  name_or_path: tiny:llama
hardware: {gpus_per_node: 0}
data:
  datasets:
    - {path: rows.jsonl, format: alpaca}
"""
ROWS = '{"instruction": "What does the cow say?", "input": "", "output": "moo"}\n' * 4
REPO = Path(__file__).resolve().parents[1]


def write_files(root: Path, files: dict) -> None:
    """Write `files` (name -> str | bytes | None) under `root`; None writes nothing."""
    for name, text in {"rows.jsonl": ROWS, **files}.items():
        if text is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))


def run_inprocess(capsys, args: list[str]) -> tuple[int, str, str]:
    """`recipeforge ARGS` through `main` in this process: (exit code, stdout, stderr)."""
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_process(cwd: Path, args: list, env: dict | None = None) -> tuple[int, str, str]:
    """`python -m recipeforge ARGS` as a real process (args may be bytes, as a shell passes them)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("RECIPEFORGE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *args], cwd=cwd, env=full_env,
                          capture_output=True, timeout=120)
    return proc.returncode, proc.stdout.decode(errors="backslashreplace"), proc.stderr.decode(errors="backslashreplace")


def assert_refused(code: int, err: str, where: str, message: str) -> None:
    """Exit 2; the first line is ``error: WHERE...`` and the output says MESSAGE; never a crash."""
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err and "RecursionError" not in err, err
    first = err.splitlines()[0] if err else ""
    assert first.startswith("error: "), err
    lines = [line.removeprefix("error: ") for line in err.splitlines()]
    assert any(line.startswith(where) for line in lines), err
    assert message in err, err
