"""The lowest dependency versions pyproject.toml allows really work: install them, train every tiny recipe.

A fresh virtual environment (no system site packages, so nothing installed here can stand in for a
floor) gets exactly the `>=` lower bound of every dependency in pyproject.toml (plus bitsandbytes and
pytest from the `dev` extra), through a constraints file and `pip install -e <repo> -c`. torch is the
exception: it is pinned to the torch running these tests, since the CPU package index has no wheel of
the floor release (see the comment in pyproject.toml). Then every tiny recipe in examples/yaml/tiny/
trains there and must exit 0 and learn, QLoRA trains on the CPU, and the prompt-length tests run
against the lowest TRL.

The environment is kept under ~/.cache/recipeforge-floors/<hash of the pins, Python and entry points> (override:
RECIPEFORGE_FLOORS_CACHE), so only the first run installs anything (about a minute with a warm pip
cache); the training runs take two to three minutes on two cores. Skipped only when the package
registry cannot be reached and no environment is cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.floors

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "yaml" / "tiny"
# From the dev extra: the QLoRA CPU run needs bitsandbytes, the prompt-length tests pytest.
DEV_EXTRAS = ("bitsandbytes", "pytest")


def floor_pins(pyproject: Path = REPO / "pyproject.toml", torch_version: str | None = None) -> list[str]:
    """`name==X` for every dependency's `>=X` lower bound (torch: `torch_version` when given)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement

    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project["dependencies"])
    wanted += [r for r in project["optional-dependencies"]["dev"] if Requirement(r).name in DEV_EXTRAS]
    pins = []
    for text in wanted:
        req = Requirement(text)
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{text}: every dependency needs one `>=` lower bound"
        version = torch_version if req.name == "torch" and torch_version else floors[0]
        pins.append(f"{req.name}=={version}")
    return pins


def test_floor_pins_come_from_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch>=2.7", "trl>=1.0,<1.17", "pyyaml>=6.0"]\n'
                         '[project.optional-dependencies]\ndev = ["pytest>=8", "hypothesis>=6"]\n')
    assert floor_pins(pyproject) == ["torch==2.7", "trl==1.0", "pyyaml==6.0", "pytest==8"]
    assert floor_pins(pyproject, torch_version="2.13.0+cpu")[0] == "torch==2.13.0+cpu"


def _run(cmd: list, *, cwd: Path = REPO, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def _clean_env(**extra: str) -> dict:
    """This process's environment minus what would let the venv see packages from outside it, plus
    this checkout first on the path: the cached environment's editable install points at whichever
    checkout built it, and the code under test is this one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def floor_python(tmp_path_factory) -> Path:
    """The python of a virtual environment with exactly the floor versions (built once, then cached)."""
    import torch

    import tomllib

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

    probe = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest",
                  tmp_path_factory.mktemp("probe"), next(p for p in pins if p.startswith("trl=="))], timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"package registry unreachable: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")

    shutil.rmtree(venv, ignore_errors=True)  # a half-built environment of an interrupted run
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = _run([sys.executable, "-m", "venv", venv])
    assert made.returncode == 0, made.stderr
    constraints = venv / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    install = _run([python, "-m", "pip", "install", "--disable-pip-version-check", "-e", REPO,
                    *DEV_EXTRAS, "-c", constraints], env=_clean_env())
    assert install.returncode == 0, (install.stdout + install.stderr)[-4000:]
    check = _run([python, "-m", "pip", "check"], env=_clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
    done.write_text("\n".join(pins) + "\n")
    return python


def test_floor_versions_are_what_is_installed(floor_python):
    listed = _run([floor_python, "-m", "pip", "list", "--format", "json"], env=_clean_env())
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}
    pins = (floor_python.parent.parent / "constraints.txt").read_text().split()
    for pin in pins:
        name, version = pin.split("==")
        from packaging.version import Version

        assert Version(installed[name.lower()]) == Version(version), (name, installed.get(name.lower()))


def _recipes(*, vision: bool = False) -> list[str]:
    """The tiny example recipes: text-only ones, or (`vision`) those of a vision-language model."""
    import yaml

    from recipeforge.components.tiny_spec import TINY_VISION, tiny_arch

    base = (yaml.safe_load((TINY / "base.yaml").read_text()) or {}).get("model", {})
    out = []
    for p in TINY.glob("*.yaml"):
        recipe = yaml.safe_load(p.read_text()) or {}
        model = recipe.get("model", {}).get("name_or_path") or base.get("name_or_path", "")  # the rest extend base.yaml
        # distill.yaml learns from a trained teacher (runs/sft-full/final): tests/integration/test_distill.py
        if "stage" in recipe and recipe.get("stage") != "distill" and (tiny_arch(model) in TINY_VISION) == vision:
            out.append(p.stem)
    return sorted(out)


def _mean(xs):
    return statistics.fmean(xs)


# Fewer steps where the recipe still clearly learns in them (DPO and GRPO keep their recipe's length).
SHORTER = {name: ["train.max_steps=15"] for name in ("pretrain", "pretrain-streaming", "sft-full", "sft-lora",
                                                         "moe-lora")}
QLORA = ["adapter.type=qlora", "train.max_steps=20", "data.val_size=8", "train.eval_steps=10",
         "output.merge_adapter=false"]


def _launch(python: Path, recipe: str, tmp_path: Path, overrides: list[str]):
    return _run([python, "-m", "recipeforge", "train", TINY / f"{recipe}.yaml", f"output.dir={tmp_path / 'run'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false", *overrides],
                cwd=tmp_path, env=_clean_env(RECIPEFORGE_CACHE=str(tmp_path / "cache")))


def _train(python: Path, recipe: str, tmp_path: Path, overrides: list[str]) -> list[dict]:
    run = tmp_path / "run"
    proc = _launch(python, recipe, tmp_path, overrides)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("split") == "train"]


def _samples_rollouts(recipe: str) -> bool:
    """Whether the tiny recipe's stage samples completions and scores them (GRPO, RLOO): `StageSpec.rollout`."""
    import yaml

    from recipeforge.stage_specs import stage_spec

    return stage_spec(yaml.safe_load((TINY / f"{recipe}.yaml").read_text())["stage"]).rollout


@pytest.mark.parametrize("recipe", _recipes())
def test_tiny_recipe_trains_at_the_floor(floor_python, recipe, tmp_path):
    train = _train(floor_python, recipe, tmp_path, SHORTER.get(recipe, []))
    if _samples_rollouts(recipe):  # an on-policy stage's policy loss is not a learning signal; its reward is
        reward = [r["reward"] for r in train if "reward" in r]
        assert len(reward) >= 4 and _mean(reward[-2:]) > _mean(reward[:2]), reward
    else:
        loss = [r["loss"] for r in train if "loss" in r]
        assert len(loss) >= 3 and loss[-1] < loss[0], loss


@pytest.mark.parametrize("recipe", _recipes(vision=True))
def test_vision_recipes_are_refused_below_their_own_floor(floor_python, recipe, tmp_path):
    # Images need a newer transformers than text (the processor's assistant mask); below it the run
    # stops before loading anything, with the version to install.
    from recipeforge.stages.vision import VISION_TRANSFORMERS_MIN

    proc = _launch(floor_python, recipe, tmp_path, [])
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert f"transformers >= {VISION_TRANSFORMERS_MIN}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "final").exists()


def test_qlora_trains_at_the_floor(floor_python, tmp_path):
    loss = [r["loss"] for r in _train(floor_python, "sft-lora", tmp_path, QLORA) if "loss" in r]
    assert loss[-1] < loss[0] - 1.0, loss


def test_prompt_lengths_at_the_floor(floor_python):
    proc = _run([floor_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_prompt_lengths.py"],
                env=_clean_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_recipes_are_found():
    assert {"pretrain", "sft-full", "sft-lora", "dpo", "grpo"} <= set(_recipes())
    assert {"vlm-sft-lora", "vlm-dpo"} <= set(_recipes(vision=True))
