"""Golden losses: the first training losses of every tiny recipe on the CPU, against the reference files
under tests/data/losses/ (one per recipe, as torchtitan keeps its loss files). A change that moves training
numerics (initialisation, data order, masking, the loss, the optimizer, a library upgrade) fails here,
recipe by recipe, with the steps that moved.

Regenerate the files on purpose, when numerics are meant to change, with one command (it rewrites every
file and reports each recipe as skipped, "reference written"):

    RECIPEFORGE_WRITE_LOSSES=1 python -m pytest tests/integration/test_golden_losses.py

and say why in the commit. Only the numbers written by the CPU build of torch are kept: a GPU or another
torch version may differ in the last digits, so the comparison allows a relative 1e-4 (and 1e-6 absolute:
GRPO's loss starts at zero). GRPO's and RLOO's first losses say little, so their mean reward per step is kept too: it
moves with every sampled token.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOSSES = REPO / "tests" / "data" / "losses"
# distill.yaml needs a trained teacher first (runs/sft-full/final): tests/integration/test_distill.py trains one.
RECIPES = sorted(p.stem for p in (REPO / "examples" / "yaml" / "tiny").glob("*.yaml")
                 if p.stem not in ("base", "distill"))
STEPS = 5
# The recipe as it is, cut to its first steps: every step logged, nothing saved or merged on the way.
OVERRIDES = (f"train.max_steps={STEPS}", "train.logging_steps=1", f"output.save_steps={STEPS}",
             "output.merge_adapter=false")
RELATIVE, ABSOLUTE = 1e-4, 1e-6
KEYS = {"grpo": ("loss", "reward"), "rloo": ("loss", "reward")}  # what is kept per step; "loss" for the others
WRITE = os.environ.get("RECIPEFORGE_WRITE_LOSSES") == "1"
REGENERATE = "RECIPEFORGE_WRITE_LOSSES=1 python -m pytest tests/integration/test_golden_losses.py"


def _versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in ("torch", "transformers", "trl", "peft", "accelerate")}


def test_every_tiny_recipe_has_its_reference():
    assert sorted(p.stem for p in LOSSES.glob("*.json")) == RECIPES, f"regenerate with: {REGENERATE}"


@pytest.mark.parametrize("name", RECIPES)
def test_first_losses_match_the_reference(tiny, tmp_path, name):
    run = tiny.train(name, tmp_path / "run", *OVERRIDES)
    values = {key: tiny.values(run, key) for key in KEYS.get(name, ("loss",))}
    assert all(len(v) == STEPS for v in values.values()), values
    path = LOSSES / f"{name}.json"
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "about": f"The first {STEPS} training steps of examples/yaml/tiny/{name}.yaml with the overrides "
                     "below, trained on a CPU; tests/integration/test_golden_losses.py compares every run with "
                     f"them (relative {RELATIVE}). Regenerate on purpose, when training numerics are meant to "
                     f"change: {REGENERATE}",
            "recipe": f"examples/yaml/tiny/{name}.yaml", "overrides": list(OVERRIDES), "versions": _versions(),
            **values}, indent=2) + "\n")
        pytest.skip(f"reference written: {path.relative_to(REPO)}")
    reference = json.loads(path.read_text())
    assert reference["overrides"] == list(OVERRIDES), f"the reference was made otherwise; {REGENERATE}"
    moved = [f"{key} at step {i + 1}: {got:.6g}, reference {want:.6g}"
             for key, got_values in values.items()
             for i, (got, want) in enumerate(zip(got_values, reference[key], strict=True))
             if got != pytest.approx(want, rel=RELATIVE, abs=ABSOLUTE)]
    assert not moved, (f"{name}: training numerics moved (reference made with {reference['versions']}):\n  "
                       + "\n  ".join(moved) + f"\nIf that is intended, regenerate: {REGENERATE}")
