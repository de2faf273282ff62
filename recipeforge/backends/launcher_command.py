"""How this Python starts torchrun or accelerate (a module of its own: the launch code and the Megatron
conversion both start them, and neither should import the other's package for it)."""

from __future__ import annotations

import sys
from pathlib import Path


def launcher_command(script: str, module: str) -> list[str]:
    """The launcher of this Python: its console script when installed next to this interpreter (a
    venv need not be on PATH), else its module run by this interpreter. Never a script found on
    PATH, which may belong to another Python, whose workers would then miss what this one has
    installed (plugins, a venv's packages)."""
    local = Path(sys.executable).parent / script
    if local.is_file():
        return [str(local)] + (["launch"] if script == "accelerate" else [])
    return [sys.executable, "-m", module]
