"""The command line in a process of its own: exit codes, error rendering, --help and --version, and
`validate`/`resolve` importing neither torch nor transformers (the rest: tests/unit/cli/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rf_testing import MINIMAL

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=120)


def test_user_error_exit_code_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "adapter:\n  tpye: lora\n")
    proc = run_cli("validate", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:8:3 adapter.tpye: unknown key 'tpye'" in proc.stderr
    assert "hint: did you mean 'type'?" in proc.stderr


def test_debug_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stage: [\n")
    proc = run_cli("--debug", "validate", str(bad))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_validate_imports_neither_torch_nor_transformers():
    code = textwrap.dedent("""
        import sys
        from recipeforge.cli import main
        assert main(["validate", "examples/yaml/qlora-70b.yaml"]) == 0
        assert main(["resolve", "examples/yaml/qlora-70b.yaml"]) == 0
        heavy = sorted(m for m in ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "datasets")
                       if m in sys.modules)
        print("HEAVY", heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_help_and_version():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("validate", "resolve", "schema", "plan", "train"):
        assert command in proc.stdout
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("recipeforge ")


def test_unknown_command_is_a_usage_error():
    proc = run_cli("trian", "x.yaml")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
