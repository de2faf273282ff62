"""`recipeforge convert axolotl` as a user types it: exit codes of the command (the conversion rules
themselves: tests/unit/convert/test_axolotl.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_convert_exit_codes(tmp_path):
    out = tmp_path / "r.yaml"
    done = run_cli("convert", "axolotl", "tests/data/axolotl/sft-lora-alpaca.yaml", "-o", str(out), "--world-size", "8")
    assert done.returncode == 0, done.stderr
    assert "world size of 8" in done.stderr and "pad_to_sequence_len: no counterpart" in done.stderr
    assert out.read_text().startswith("# Converted from the Axolotl config sft-lora-alpaca.yaml")
    assert run_cli("validate", str(out)).returncode == 0
    done = run_cli("convert", "axolotl", "tests/data/axolotl/grpo-gsm8k.yaml")
    assert done.returncode == 0 and yaml.safe_load(done.stdout)["stage"] == "grpo"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\n")
    done = run_cli("convert", "axolotl", str(bad))
    assert done.returncode == 2 and "no base_model" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("convert", "axolotl", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2 and "cannot read" in done.stderr
