"""The documentation is executable: every command README.md and docs/*.md show runs, and every command
and flag they name exists.

Commands are the lines of ```bash / ```sh blocks and the ``$ `` lines of any block. They run in order,
README first and then the docs by name, in one scratch directory holding a copy of examples/ (as a
reader following the pages from a clone would), so a page may use what an earlier one made
(`runs/sft-lora` of the quick start). A recipe sized for GPUs runs as `train --dry-run`. The few
commands that cannot run here are listed in `NOT_RUN` with the reason; a listed command that no page
shows any more fails the test too, so the list stays true.

The second test reads every `recipeforge ...` a page names (code spans, tables, blocks, synopses with
placeholders) and checks the command and each of its flags against the help text of that command.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Commands shown but not run, with the reason.
NOT_RUN = {
    'python -c "import torch" 2>/dev/null || pip install torch==2.13.0': "installs packages: what CI does first",
    "pip install -e .": "installs this checkout: done by CI before the tests",
    'pip install -e ".[dev]"': "installs this checkout: done by CI before the tests",
    "pip install 'recipeforge[report]'": "installs an extra that the dev extra already holds",
    "bash .ci/tests": "the test suite itself, every step of CI",
    "ray start --head --port 6379": "starts a Ray cluster: .ci/ray's tests start their own",
    "recipeforge launch --ray examples/yaml/llama3-8b-full-sft.yaml --ray-address HEAD:6379 "
    "output.dir=/shared/runs/llama3-8b-sft": "needs a Ray cluster of GPU nodes (.ci/ray launches the tiny recipe on a local one)",
}
# A documented exit code other than 0 (`diff` exits 1 when the sides differ).
EXIT_CODES = {"recipeforge diff examples/yaml/tiny/sft-lora.yaml runs/sft-lora": 1}

_BLOCK = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)


def shown_commands(page: Path) -> list[str]:
    """The commands of a page, in order: `&&`/`;` chains split, comments and prompts removed."""
    out: list[str] = []
    for lang, body in _BLOCK.findall(page.read_text()):
        for line in body.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            elif lang not in ("bash", "sh", "shell"):
                continue
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            out.extend(part.strip() for part in re.split(r"\s*(?:&&|;)\s*", line) if part.strip())
    return out


def all_shown() -> list[tuple[Path, str]]:
    return [(page, cmd) for page in PAGES for cmd in shown_commands(page)]


def _gpu_sized(recipe: Path, cwd: Path) -> bool:
    """Whether the recipe is planned for GPUs (its hardware: section, or the table of the README)."""
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "plan", str(recipe), "--json"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=_env())
    return proc.returncode == 0 and '"device": "cuda"' in proc.stdout


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "RECIPEFORGE_PROGRESS_INTERVAL": "3600"}


@pytest.mark.slow
def test_every_shown_command_runs(tmp_path):
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    shown = all_shown()
    assert len(shown) >= 10  # the pages do show commands
    ran, skipped = [], []
    for page, cmd in shown:
        if cmd in NOT_RUN:
            skipped.append(cmd)
            continue
        argv = shlex.split(cmd)
        assert argv[0] == "recipeforge", f"{page.name}: `{cmd}` is neither run here nor listed in NOT_RUN"
        if argv[1] == "train" and "--dry-run" not in argv and _gpu_sized(tmp_path / argv[2], tmp_path):
            argv.append("--dry-run")  # a GPU-sized recipe: the launch it would make, on this CPU
        proc = subprocess.run([sys.executable, "-m", "recipeforge", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=900, env=_env())
        expected = EXIT_CODES.get(cmd, 0)
        assert proc.returncode == expected, f"{page.name}: `{cmd}` exited {proc.returncode}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr
        ran.append(cmd)
    assert set(NOT_RUN) <= set(skipped), f"listed in NOT_RUN but shown nowhere: {set(NOT_RUN) - set(skipped)}"
    assert len(ran) >= 8


# ----------------------------------------------------------------------------- named commands and flags

_NAMED = re.compile(r"(?<![\w/.\-\[])recipeforge((?:\s+[^\s`|]+)+)")


_SHORT = re.compile(r"^([a-z][a-z-]*)((?:\s+--[a-z][\w-]*(?:[= ][^\s`]+)?)+)$")  # `train --strict`


def named_commands() -> list[tuple[str, str, list[str], bool]]:
    """(page, subcommand, flags, explicit) for every `recipeforge SUB ...` a page names, in code or in
    blocks, and every code span such as `train --strict` (explicit False: a command only if SUB is one)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        code = re.findall(r"`([^`\n]+)`", text)
        spans = code + [c for _, body in _BLOCK.findall(text) for c in body.splitlines()]
        for span in code:
            short = _SHORT.match(span.strip())
            if short:
                found.append((page.name, short.group(1), re.findall(r"--[a-z][a-z-]*", short.group(2)), False))
        for span in spans:
            for match in _NAMED.finditer(span):
                words = match.group(1).split()
                sub = words[0]
                if not re.fullmatch(r"[a-z][a-z-]*", sub):
                    continue
                if sub == "convert" and len(words) > 1 and words[1] == "axolotl":
                    words = words[1:]
                flags = [re.split(r"[=\]]", w.strip("[]"))[0] for w in words[1:] if w.lstrip("[").startswith("--")]
                found.append((page.name, sub, [f for f in flags if re.fullmatch(r"--[a-z][a-z-]*", f)], True))
    return found


def _help(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "recipeforge", *args, "--help"], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_every_named_command_and_flag_exists():
    top = _help()
    listing = top.split("\n  COMMAND\n", 1)[1].split("\noptions:")[0]  # the commands under COMMAND
    commands = set(re.findall(r"^    ([a-z][a-z-]*)", listing, re.M))
    assert {"train", "plan", "validate"} <= commands
    global_flags = set(re.findall(r"(--[a-z][a-z-]*)", top))
    helps: dict[str, set[str]] = {}
    named = named_commands()
    assert len(named) >= 30
    missing = []
    for page, sub, flags, explicit in named:
        if not explicit and sub not in commands:
            continue  # `accelerate launch --cpu`: another tool's command
        if sub not in commands:
            missing.append(f"{page}: recipeforge {sub} (no such command; commands: {', '.join(sorted(commands))})")
            continue
        if sub not in helps:
            helps[sub] = set(re.findall(r"(--[a-z][a-z-]*)", _help(sub))) | global_flags
        missing.extend(f"{page}: recipeforge {sub} {flag} (not in `recipeforge {sub} --help`)"
                       for flag in flags if flag not in helps[sub])
    assert not missing, "\n".join(missing)
