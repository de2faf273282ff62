"""``python -m recipeforge.run.worker SPEC``, the one worker entry, run as a launcher runs it: a spec it
cannot trust or read, or a recipe mistake in it, is a short message and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from surface_testing import REPO, refused

from recipeforge.backends.worker_spec import WorkerSpec
from recipeforge.settings import Settings

RECIPE = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"


def worker(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECIPEFORGE_")}
    return subprocess.run([sys.executable, "-m", "recipeforge.run.worker", *args], cwd=cwd, capture_output=True,
                          timeout=300, env={**env, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})


def _spec(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    spec = WorkerSpec(plan=str(run / "plan.json"), run_dir=str(run), outcome=str(run / "outcome.json"),
                      recipe=str(RECIPE), overrides=(f"output.dir={run}", *overrides), settings=Settings())
    spec.write(run / "worker.json")
    return run / "worker.json"


def test_a_spec_others_may_write_is_refused(tmp_path):
    path = _spec(tmp_path)
    path.chmod(0o666)
    refused(worker(str(path), cwd=tmp_path), "not private to this user", "recipeforge train")
    assert not (tmp_path / "run" / "outcome.json").exists()  # nothing run, nothing reported


def test_a_forged_field_is_refused(tmp_path):
    path = _spec(tmp_path)
    data = json.loads(path.read_text())
    data["settings"]["trust_code"] = "yes"
    path.write_text(json.dumps(data))
    refused(worker(str(path), cwd=tmp_path), "settings.trust_code has the wrong type")


def test_a_recipe_mistake_is_located_and_reported_to_the_launching_command(tmp_path):
    path = _spec(tmp_path, "train.learning_rate=fast")
    err = refused(worker(str(path), cwd=tmp_path), "train.learning_rate")
    outcome = json.loads((tmp_path / "run" / "outcome.json").read_text())  # what the launching command prints
    assert outcome["kind"] == "user_error" and "train.learning_rate" in outcome["message"] in err


def test_without_a_spec_it_says_how_it_is_used(tmp_path):
    proc = worker(cwd=tmp_path)
    assert proc.returncode == 2 and b"usage: python -m recipeforge.run.worker" in proc.stderr
