"""`recipeforge plan` on a Qwen2.5-VL-7B LoRA recipe, run as a user types it: the plan shows the
vision tower and projector, what one image costs, and the vision activation term."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "tests" / "plan" / "fixtures" / "qwen2.5-vl-7b-lora.yaml"


def _plan(*extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "recipeforge", "plan", str(RECIPE), "--hardware", "1xH100-80GB",
                           *extra], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_plan_shows_the_vision_side_and_the_cost_of_one_image():
    out = _plan()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Model: Qwen/Qwen2.5-VL-7B-Instruct (qwen2_5_vl, 8.29B params" in text
    assert "Vision: qwen2_5_vl tower 632.0M params (frozen), projector 44.6M (trains, LoRA adapters)" in text
    assert "one 1003520-px image = 5120 patches -> 1280 LLM tokens" in text
    assert "1280 of the 4096 tokens of a sample are image tokens" in text
    assert "tower 0 (frozen: nothing kept)" in text and "projector 37.5 MiB" in text
    assert "data.sequence_len bounds text and image tokens together" in text
    assert any(line.strip().startswith("vision activations") for line in text.splitlines())


def test_plan_json_carries_the_same_fields():
    out = _plan("--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    vision = plan["extra"]["vision"]
    assert vision["tower_params"] == 631_975_680 and vision["projector_params"] == 44_574_464
    image = (vision["image_pixels"], vision["patches_per_image"], vision["llm_tokens_per_image"])
    assert image == (1003520, 5120, 1280)
    assert vision["train_tower"] is False and vision["train_projector"] is True
    assert plan["memory_gb"]["vision_activations"] > 0
    assert plan["extra"]["model"]["params"] == 8_292_166_656
