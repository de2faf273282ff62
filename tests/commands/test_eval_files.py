"""`recipeforge validate` checks the local evaluation tasks a recipe names, and asks for lm-eval when
`train` would evaluate, run as a user types it (the task files: tests/unit/tools/test_eval_files.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _jsonl(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


REPO = Path(__file__).resolve().parents[2]


def _validate(tmp_path: Path, tasks: list[str], *, hide_lm_eval: bool = False) -> subprocess.CompletedProcess:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'examples/yaml/tiny/sft-lora.yaml'}\neval:\n  tasks: {json.dumps(tasks)}\n")
    # lm-eval made unimportable in this one process, as Python sees a package that is not installed.
    hide = "sys.modules['lm_eval'] = None; " if hide_lm_eval else ""
    code = f"import sys; {hide}from recipeforge.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "validate", str(recipe)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_validate_checks_local_eval_tasks_where_the_recipe_names_them(tmp_path):
    _jsonl(tmp_path / "qa.jsonl", {"prompt": "a", "reference": "b"})
    _jsonl(tmp_path / "bad.jsonl", {"prompt": "a", "reference": "b"}, {"prompt": 1})
    assert _validate(tmp_path, ["qa.jsonl", "arc_easy"]).returncode == 0
    proc = _validate(tmp_path, ["qa.jsonl", "bad.jsonl"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "r.yaml:3" in proc.stderr  # the line of eval.tasks in the recipe
    assert "eval.tasks[1]: " in proc.stderr and "bad.jsonl:2: malformed task row" in proc.stderr
    proc = _validate(tmp_path, ["missing.jsonl"])
    assert proc.returncode == 2 and "task file not found: missing.jsonl" in proc.stderr


def test_validate_asks_for_lm_eval_when_train_would_evaluate(tmp_path):
    proc = _validate(tmp_path, ["arc_easy"], hide_lm_eval=True)
    assert proc.returncode == 2 and "lm-eval is not installed" in proc.stderr
    assert "pip install 'recipeforge[eval]'" in proc.stderr and "Traceback" not in proc.stderr
