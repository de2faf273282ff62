"""The GPU benchmark harnesses (bench/gpu/) run end to end on a CPU with `--smoke`: the same recipes,
plans, runs and the bare TRL reference on a tiny shape, so a GPU session spends its time measuring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu"


def _run(script: str, out: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(BENCH / script), "--out", str(out), "--smoke", "--steps", "6", *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = out.glob("gpu-*.json")
    return json.loads(result.read_text())


def test_suite_plans_trains_and_measures_a_case(tmp_path):
    result = _run("suite.py", tmp_path, "--cases", "full-1b", "lora-8b-ckpt")
    assert result["versions"]["torch"] and [c["case"] for c in result["cases"]] == ["full-1b", "lora-8b-ckpt"]
    for case in result["cases"]:
        assert case["status"] == "ok", case
        assert case["plan_gb"] > 0 and case["tokens_per_s"] > 0 and case["loss_first"] is not None
        assert case["measured_reserved_gb"] is None  # a CPU has no allocator peak to measure
    assert result["cases"][1]["adapter"] == "lora"
    # a measured run keeps its logs and metrics, not its weights (a suite of 8B runs would fill the disk)
    run = tmp_path / "runs" / "full-1b"
    assert (run / "metrics.jsonl").is_file() and (run / "final" / "config.json").is_file()
    assert not list(run.rglob("*.safetensors")) and (tmp_path / "runs" / "full-1b.stderr").is_file()
    markdown = next(tmp_path.glob("gpu-*.md")).read_text()
    assert "| full-1b | single | none |" in markdown


def test_throughput_runs_recipeforge_and_the_bare_trl_script_alike(tmp_path):
    result = _run("throughput.py", tmp_path, "--cases", "8b-lora")
    (case,) = result["cases"]
    assert case["status"] == "ok", case
    assert case["tokens_per_s"] > 0 and case["trl_tokens_per_s"] > 0 and case["ratio"] > 0
    trl = json.loads((tmp_path / "trl" / "8b-lora.json").read_text())
    assert trl["loss_first"] is not None and trl["tokens_per_s"] == case["trl_tokens_per_s"]
