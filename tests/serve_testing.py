"""`recipeforge serve` started as a user starts it, for the tests that talk to it over HTTP.

`start_serve` runs `python -m recipeforge serve RUN --port 0 --engine transformers --device cpu ...` with
this checkout first on the path and no API key inherited from the caller's environment (a test that wants
one passes it), waits for the announcement (the `serving ... at URL` line and the curl line after it) and
returns the process, the URL and the announcement. A server that exits or stays silent fails the test with
its stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Served:
    """A running `recipeforge serve`: its process, base URL (ending in /v1) and what it printed on start."""

    proc: subprocess.Popen
    url: str
    announcement: str

    def stop(self) -> None:
        """Terminate the server and wait for it (it handles SIGTERM)."""
        self.proc.terminate()
        self.proc.wait(timeout=30)


def start_serve(run: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> Served:
    """Start `recipeforge serve RUN` on a free port with `args`; return once it answers."""
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    full.pop("RECIPEFORGE_API_KEY", None)
    full.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "recipeforge", "serve", str(run), "--port", "0",
                             "--engine", "transformers", "--device", "cpu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=run.parent)
    assert proc.stdout is not None and proc.stderr is not None
    deadline, lines = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("  curl ") and len(lines) >= 2 and lines[-2].startswith("serving "):
            return Served(proc, lines[-2].split(" at ")[1].split()[0], "".join(lines))
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the server did not start: {proc.stderr.read()[-3000:]}")
