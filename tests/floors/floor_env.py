"""The virtual environment of the dependency floors: exactly the `>=` lower bound of every dependency in
pyproject.toml, built once and cached (tests/floors/test_dependency_floors.py says what it proves).

    python tests/floors/floor_env.py     # build it now (CI does, in the background, while other tiers run)

It lives under ~/.cache/recipeforge-floors/<hash of the pins, Python and entry points> (override:
RECIPEFORGE_FLOORS_CACHE), so only the first build installs anything: about a minute with a warm pip cache,
three with a cold one. A half-built environment (an interrupted build) is built again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# From the dev extra: the QLoRA CPU run needs bitsandbytes, the prompt-length tests pytest.
DEV_EXTRAS = ("bitsandbytes", "pytest")


class RegistryUnreachable(RuntimeError):
    """The package registry cannot be reached and no environment is cached."""


def floor_pins(pyproject: Path = REPO / "pyproject.toml", torch_version: str | None = None) -> list[str]:
    """`name==X` for every dependency's `>=X` lower bound (torch: `torch_version` when given)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"])
    wanted += [r for r in project["optional-dependencies"]["dev"] if Requirement(r).name in DEV_EXTRAS]
    pins = []
    for text in wanted:
        req = Requirement(text)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        if len(floors) != 1:
            raise ValueError(f"{text}: every dependency needs one `>=` lower bound")
        version = torch_version if req.name == "torch" and torch_version else floors[0]
        pins.append(f"{req.name}=={version}")
    return pins


def run(cmd: list, *, cwd: Path = REPO, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """`cmd` with its output captured as text."""
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def clean_env(**extra: str) -> dict:
    """This process's environment minus what would let the venv see packages from outside it, plus
    this checkout first on the path: the cached environment's editable install points at whichever
    checkout built it, and the code under test is this one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def floor_python() -> Path:
    """The python of a virtual environment with exactly the floor versions (built once, then cached).
    Raises `RegistryUnreachable` when it must be built and the registry does not answer."""
    import tomllib

    import torch

    pins = floor_pins(torch_version=torch.__version__)
    # What the environment holds: the pins, the Python, and what an editable install writes from the
    # project table (entry points); other edits of pyproject.toml reuse the environment.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = {"pins": pins, "python": sys.version, "scripts": project.get("scripts"),
                 "entry-points": project.get("entry-points")}
    key = hashlib.sha256(json.dumps(installed, sort_keys=True).encode())
    root = Path(os.environ.get("RECIPEFORGE_FLOORS_CACHE", Path.home() / ".cache" / "recipeforge-floors"))
    venv = root / key.hexdigest()[:16]
    python = venv / "bin" / "python"
    done = venv / ".complete"
    if done.is_file():
        return python

    with tempfile.TemporaryDirectory() as probe_dir:
        probe = run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", probe_dir,
                     next(p for p in pins if p.startswith("trl=="))], timeout=300)
    if probe.returncode != 0:
        raise RegistryUnreachable(f"package registry unreachable: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")

    shutil.rmtree(venv, ignore_errors=True)  # a half-built environment of an interrupted run
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = run([sys.executable, "-m", "venv", venv])
    if made.returncode != 0:
        raise RuntimeError(f"python -m venv {venv} failed: {made.stderr[-2000:]}")
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    install = run([python, "-m", "pip", "install", "--disable-pip-version-check", "-e", REPO, *DEV_EXTRAS,
                   "-c", constraints], env=clean_env())
    if install.returncode != 0:
        raise RuntimeError(f"installing the floors failed: {(install.stdout + install.stderr)[-4000:]}")
    check = run([python, "-m", "pip", "check"], env=clean_env())
    if check.returncode != 0:
        raise RuntimeError(f"pip check in the floor environment failed: {check.stdout + check.stderr}")
    done.write_text("\n".join(pins) + "\n")
    return python


if __name__ == "__main__":
    try:
        print(floor_python())
    except RegistryUnreachable as e:  # the floors step skips then, as on a machine without a registry
        print(e)
