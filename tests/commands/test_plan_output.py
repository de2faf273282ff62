"""What planning produces, checked in processes of their own: DeepSpeed accepts the generated configs,
and planning imports neither torch nor a backend (the rest: tests/unit/plan/test_plan_output.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.backends.artifacts import deepspeed_config
from recipeforge.plan import make_plan, parse_hardware

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_accepts_the_configs(recipe, tmp_path):
    # One GPU, so DeepSpeed's batch check (micro x accumulation x world) holds without a process group;
    # one subprocess for all presets, so deepspeed stays out of this process.
    configs = []
    for preset in ("zero2", "zero3", "zero2_offload", "zero3_offload", "zero3_offload_params"):
        r = recipe("Qwen/Qwen2.5-0.5B", distributed={"backend": "deepspeed", "preset": preset})
        configs.append(deepspeed_config(make_plan(r, parse_hardware("1xA100-80GB")), r))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(configs))
    code = ("import json, sys; from deepspeed.runtime.config import DeepSpeedConfig\n"
            "for cfg in json.load(open(sys.argv[1])):\n"
            "    c = DeepSpeedConfig(cfg)\n"
            "    print(c.zero_optimization_stage, c.train_batch_size, c.zero_config.offload_optimizer is not None,"
            " c.zero_config.offload_param is not None)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = out.stdout.strip().splitlines()[-len(configs):]
    assert len(rows) == len(configs)
    for cfg, row in zip(configs, rows, strict=True):
        stage, batch, offload_opt, offload_param = row.split()
        zero = cfg["zero_optimization"]
        assert int(stage) == zero["stage"] and int(batch) == cfg["train_batch_size"]
        assert (offload_opt == "True") == ("offload_optimizer" in zero)
        assert (offload_param == "True") == ("offload_param" in zero)


def test_planning_imports_no_torch_or_backend():
    tiny = ROOT / "examples" / "yaml" / "tiny" / "sft-full.yaml"
    code = f"""
import sys
from recipeforge.config import load_recipe
from recipeforge.plan import make_plan, render_plan, probe_local_hardware, parse_hardware
recipe = load_recipe({str(tiny)!r}).recipe
render_plan(make_plan(recipe))
render_plan(make_plan(recipe, parse_hardware("1xH100-80GB")))
big = load_recipe({str(tiny)!r}, overrides=["model.name_or_path=meta-llama/Llama-3.1-70B",
                                            "train.micro_batch_size=auto", "train.global_batch_size=64"]).recipe
render_plan(make_plan(big, parse_hardware("2x8xH100-80GB")))
probe_local_hardware()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in
               ("torch", "transformers", "deepspeed", "accelerate", "megatron", "peft", "trl", "bitsandbytes"))
print(",".join(heavy) or "none")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "none"
