"""`data.streaming` at `recipeforge validate`: what a stream cannot do is refused at the key to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECIPE = """\
stage: {stage}
model: {{name_or_path: "tiny:llama"}}
data:
  datasets:
    - path: {data}
      format: {fmt}
      dedup: true
  streaming: true
  val_size: 0.1
train:
  epochs: 2
"""


def _validate(tmp_path: Path, text: str, *overrides: str) -> subprocess.CompletedProcess:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    (tmp_path / "d.jsonl").write_text('{"text": "a b c"}\n')
    return subprocess.run([sys.executable, "-m", "recipeforge", "validate", str(path), *overrides],
                          capture_output=True, text=True, timeout=120)


def test_what_a_stream_cannot_do_is_said_at_its_key(tmp_path):
    proc = _validate(tmp_path, RECIPE.format(stage="pretrain", data="d.jsonl", fmt="text"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr
    assert "r.yaml:11:3 train.epochs" not in err
    assert "train.max_steps: a streamed corpus has no length" in err
    assert "r.yaml:9:3 data.val_size: rows cannot be held out of a stream" in err
    assert "r.yaml:7:7 data.datasets[0].dedup: dropping duplicates needs every row" in err


def test_stages_whose_trainer_tokenizes_cannot_stream(tmp_path):
    text = RECIPE.format(stage="dpo", data="d.jsonl", fmt="preference").replace("      dedup: true\n", "") \
        .replace("  val_size: 0.1\n", "").replace("epochs: 2", "max_steps: 3")
    proc = _validate(tmp_path, text)
    assert proc.returncode == 2
    assert "r.yaml:7:3 data.streaming: stage dpo reads its rows whole" in proc.stderr, proc.stderr


def test_stream_settings_without_streaming_are_refused(tmp_path):
    text = RECIPE.format(stage="pretrain", data="d.jsonl", fmt="text").replace("      dedup: true\n", "") \
        .replace("  val_size: 0.1\n", "").replace("epochs: 2", "max_steps: 3")
    proc = _validate(tmp_path, text, "data.streaming=false", "data.stream_log=true")
    assert proc.returncode == 2
    assert "data.stream_log: data.stream_log has no effect without data.streaming: true" in proc.stderr, proc.stderr
    ok = _validate(tmp_path, text)
    assert ok.returncode == 0, ok.stderr
