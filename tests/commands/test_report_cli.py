"""`recipeforge report` on the command line: bad input is exit 2 without a traceback, and matplotlib
stays off the light commands."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from report_testing import make_run

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "recipeforge", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_bad_input_is_exit_2_without_traceback(tmp_path):
    run = make_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("{oops}\n{\"split\": \"train\", \"step\": 9}\n")
    proc = run_cli("report", run, tmp_path / "nowhere")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{run / 'metrics.jsonl'}:6: row is not valid JSON" in proc.stderr
    assert "nowhere: no such directory" in proc.stderr
    proc = run_cli("report")
    assert proc.returncode == 2 and "RUN_DIR" in proc.stderr  # argparse: at least one run


def test_report_command_writes_the_page(tmp_path):
    pytest.importorskip("matplotlib", reason="the report needs the `report` extra (matplotlib)")
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", lr=0.002)
    out = tmp_path / "pages" / "cmp.html"
    proc = run_cli("report", a, b, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"report of a, b written to {out} (3 charts)"
    assert (tmp_path / "pages" / "cmp-loss.png").is_file()
    proc = run_cli("report", a, "--out", tmp_path)
    assert proc.returncode == 2 and "is a directory, not a file" in proc.stderr


def test_light_commands_do_not_import_matplotlib(tmp_path):
    code = textwrap.dedent("""
        import contextlib, io, sys
        from recipeforge.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main(["--help"])
            except SystemExit:
                pass
            assert main(["validate", "examples/yaml/tiny/sft-lora.yaml"]) == 0
            assert main(["plan", "examples/yaml/tiny/sft-lora.yaml"]) == 0
        print("HEAVY", sorted(m for m in ("matplotlib", "torch", "transformers") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_report_imports_no_torch(tmp_path):
    pytest.importorskip("matplotlib", reason="the report needs the `report` extra (matplotlib)")
    run = make_run(tmp_path / "run")
    code = textwrap.dedent(f"""
        import sys
        from recipeforge.cli import main
        assert main(["report", {str(run)!r}]) == 0
        print("HEAVY", sorted(m for m in ("matplotlib", "torch", "transformers") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY ['matplotlib']" in proc.stdout
