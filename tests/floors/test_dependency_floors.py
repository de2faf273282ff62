"""The lowest dependency versions pyproject.toml allows really work: install them, train every tiny recipe.

A fresh virtual environment (no system site packages, so nothing installed here can stand in for a
floor) gets exactly the `>=` lower bound of every dependency in pyproject.toml (plus bitsandbytes and
pytest from the `dev` extra), through a constraints file and `pip install -e <repo> -c`. torch is the
exception: it is pinned to the torch running these tests, since the CPU package index has no wheel of
the floor release (see the comment in pyproject.toml). Then every tiny recipe in examples/yaml/tiny/
trains there and must exit 0 and learn, QLoRA trains on the CPU, and the prompt-length tests run
against the lowest TRL.

tests/floors/floor_env.py builds the environment and keeps it under ~/.cache/recipeforge-floors/<hash> (override:
RECIPEFORGE_FLOORS_CACHE), so only the first run installs anything (about a minute with a warm pip
cache); the training runs take two to three minutes on two cores. Skipped only when the package
registry cannot be reached and no environment is cached.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor_env import REPO, RegistryUnreachable, clean_env, floor_pins, run  # noqa: E402
from floor_env import floor_python as build_floor_python  # noqa: E402

pytestmark = pytest.mark.floors

TINY = REPO / "examples" / "yaml" / "tiny"


def test_floor_pins_come_from_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch>=2.7", "trl>=1.0,<1.17", "pyyaml>=6.0"]\n'
                         '[project.optional-dependencies]\ndev = ["pytest>=8", "hypothesis>=6"]\n')
    assert floor_pins(pyproject) == ["torch==2.7", "trl==1.0", "pyyaml==6.0", "pytest==8"]
    assert floor_pins(pyproject, torch_version="2.13.0+cpu")[0] == "torch==2.13.0+cpu"


@pytest.fixture(scope="module")
def floor_python() -> Path:
    """The python of the floor environment (tests/floors/floor_env.py builds it, or finds it built)."""
    try:
        return build_floor_python()
    except RegistryUnreachable as e:
        pytest.skip(str(e))


def test_floor_versions_are_what_is_installed(floor_python):
    listed = run([floor_python, "-m", "pip", "list", "--format", "json"], env=clean_env())
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
    return run([python, "-m", "recipeforge", "train", TINY / f"{recipe}.yaml", f"output.dir={tmp_path / 'run'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false", *overrides],
                cwd=tmp_path, env=clean_env(RECIPEFORGE_CACHE=str(tmp_path / "cache")))


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
    proc = run([floor_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_prompt_lengths.py"],
                env=clean_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_recipes_are_found():
    assert {"pretrain", "sft-full", "sft-lora", "dpo", "grpo"} <= set(_recipes())
    assert {"vlm-sft-lora", "vlm-dpo"} <= set(_recipes(vision=True))
