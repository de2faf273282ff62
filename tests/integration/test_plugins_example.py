"""plugins/recipeforge-example, pip-installed into this environment: a recipe built on its base
recipe (``extends: pkg://example/grpo-qa.yaml``) with its reward, dataset format and model validates,
plans and trains on the CPU.

The install is real (pip, entry points in the environment's site-packages) and idempotent: it is
skipped when the installed distribution already matches the source tree (files and entry points).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "plugins" / "recipeforge-example"
ROWS = [("Which sound does the cat make?", "meow"), ("Which sound does the dog make?", "woof"),
        ("Which sound does the cow make?", "moo"), ("Which sound does the duck make?", "quack")]


def _declared_entry_points() -> set[tuple[str, str, str]] | None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader, so always reinstall
        return None
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    return {(group, name, value) for group, eps in project["entry-points"].items() for name, value in eps.items()}


def _installed_matches_source() -> bool:
    from importlib import metadata

    try:
        dist = metadata.distribution("recipeforge-example")
    except metadata.PackageNotFoundError:
        return False
    declared = _declared_entry_points()
    if declared is None or {(ep.group, ep.name, ep.value) for ep in dist.entry_points} != declared:
        return False
    src = EXAMPLE / "src"
    for path in src.rglob("*"):
        if path.suffix in (".py", ".yaml"):
            installed = Path(str(dist.locate_file(path.relative_to(src))))
            if not installed.is_file() or installed.read_bytes() != path.read_bytes():
                return False
    return True


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    """recipeforge-example installed in this environment (pip; skipped when already up to date)."""
    from recipeforge.registry import refresh_entry_points

    if not _installed_matches_source():
        # pip builds in the source tree: build from a copy so the checkout stays clean.
        copy = tmp_path_factory.mktemp("example") / "recipeforge-example"
        shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--force-reinstall", "--disable-pip-version-check", str(copy)], check=True)
        refresh_entry_points()
        assert _installed_matches_source(), "pip did not install plugins/recipeforge-example as it is"
    refresh_entry_points()
    return "recipeforge-example"


def _recipe(tmp_path: Path, body: str = "") -> Path:
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in ROWS * 4))
    path = tmp_path / "recipe.yaml"
    path.write_text(f"""\
extends: pkg://example/grpo-qa.yaml
hardware: {{gpus_per_node: 0}}
data:
  datasets:
    - {{path: qa.jsonl, format: qa}}
train: {{max_steps: 3}}
output: {{dir: {tmp_path / 'run'}}}
logging: {{progress_bar: false}}
{body}""")
    return path


def test_a_recipe_using_the_plugin_validates_plans_and_trains(example_plugin, tmp_path):
    from recipeforge.config import load_recipe
    from recipeforge.config.validate import check_components
    from recipeforge.outputs.metrics import read_metrics
    from recipeforge.plan import make_plan, render_plan
    from recipeforge.plugins import annotate_plan
    from recipeforge.run import train

    loaded = load_recipe(_recipe(tmp_path))
    check_components(loaded)
    r = loaded.recipe
    assert (r.model.name_or_path, r.data.datasets[0].format, r.grpo.rewards[0].name) == \
        ("example/tiny-wide", "qa", "word_overlap")  # all from the plugin's base recipe and registries

    plan = annotate_plan(make_plan(r), r)
    assert plan.reasons["model"].reason == "counted from plugin recipeforge-example 0.1.0"
    assert {(p["group"], p["name"], p["distribution"]) for p in plan.extra.plugins} == {
        ("recipeforge.models", "example/tiny-wide", example_plugin),
        ("recipeforge.formats", "qa", example_plugin),
        ("recipeforge.rewards", "word_overlap", example_plugin)}
    assert "Plugins used:" in render_plan(plan)

    run = train(loaded, overwrite=True)
    records = [rec for rec in read_metrics(run / "metrics.jsonl") if rec.get("split") == "train"]
    overlap = [rec["rewards/word_overlap/mean"] for rec in records if "rewards/word_overlap/mean" in rec]
    assert len(overlap) == 3 and all(0.0 <= v <= 1.0 and math.isfinite(v) for v in overlap)
    assert (run / "final" / "model.safetensors").is_file()
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["hidden_size"] == 96 and config["tie_word_embeddings"] is True  # the plugin's architecture


def test_the_plugin_reports_and_names_its_components(example_plugin, tmp_path):
    from recipeforge.config import load_recipe
    from recipeforge.config.validate import check_components
    from recipeforge.errors import RecipeError
    from recipeforge.plugins import render_plugins

    text = render_plugins()
    for name in ("word_overlap", "qa", "example/tiny-wide", "example"):
        assert any(line.split()[:3] == [name, example_plugin, "0.1.0"] and line.endswith(
            "loaded" if name != "example" else "loaded (pkg://example/grpo-qa.yaml)") for line in text.splitlines()), name

    path = _recipe(tmp_path, "grpo:\n  rewards: [{name: word_overlp}]\n")
    with pytest.raises(RecipeError) as info:
        check_components(load_recipe(path))
    (p,) = info.value.problems
    assert p.message == "unknown reward 'word_overlp'" and p.location.line == 10
    assert p.hint.startswith("did you mean 'word_overlap'? available:") and p.hint.endswith("word_overlap")
