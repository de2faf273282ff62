"""`recipeforge train` checks a chat recipe's template against serving before step 0: shipped templates
train; a template whose generation prompt is not what it writes before a reply is refused (exit 2,
naming the token and the fix) before anything trains, unless `data.template_check: false`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
CHATML = ROOT / "recipeforge" / "components" / "chat_templates" / "chatml.jinja"


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", "train", str(TINY), f"output.dir={tmp_path / 'run'}",
                           f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false", "train.max_steps=2", "train.logging_steps=1",
                           "output.merge_adapter=false", *overrides],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)


def _trained_steps(run: Path) -> list[int]:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return []
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["step"] for r in records if r.get("split") == "train" and r.get("loss") is not None]


def _mismatched(tmp_path: Path) -> Path:
    """ChatML whose generation prompt opens the reply with a space, where training writes a newline."""
    text = CHATML.read_text()
    served = text.replace("{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}",
                          "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant ' }}")
    assert served != text
    path = tmp_path / "mismatched.jinja"
    path.write_text(served)
    return path


@pytest.mark.parametrize("template", ["tokenizer", "llama3", "qwen3"])
def test_a_shipped_template_passes_and_trains(tmp_path, template):
    done = _train(tmp_path, f"data.chat_template={template}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "chat template: training and serving give the same tokens" in done.stdout + done.stderr
    assert _trained_steps(tmp_path / "run") == [1, 2]


def test_a_mismatched_template_is_refused_before_step_0(tmp_path):
    done = _train(tmp_path, f"data.chat_template={_mismatched(tmp_path)}")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    # The key, the first differing token on each side, and the fix (and how to skip the check).
    assert "data.chat_template" in done.stderr and "before assistant reply 1 of probe conversation 1" in done.stderr
    assert "differs: training has 'Ċ', serving has 'Ġ' (after" in done.stderr and "assistant')" in done.stderr
    assert "add_generation_prompt" in done.stderr and "data.template_check: false" in done.stderr
    assert _trained_steps(tmp_path / "run") == []
    assert not (tmp_path / "run" / "checkpoints").is_dir() or not any((tmp_path / "run" / "checkpoints").iterdir())


def test_the_check_can_be_skipped(tmp_path):
    done = _train(tmp_path, f"data.chat_template={_mismatched(tmp_path)}", "data.template_check=false")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "chat template:" not in done.stdout + done.stderr
    assert _trained_steps(tmp_path / "run") == [1, 2]
