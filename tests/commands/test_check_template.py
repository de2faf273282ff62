"""`recipeforge check-template` as a user types it: ok on a shipped template, exit 2 naming the differing
token and data.chat_template when the server applies another template."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "yaml" / "tiny" / "sft-lora.yaml"


def _rf(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


def test_a_shipped_template_passes(tmp_path):
    done = _rf(tmp_path, "check-template", str(TINY), "data.chat_template=llama3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok:") and "llama3" in done.stdout


def test_a_mismatched_server_template_names_the_token_and_the_key(tmp_path):
    jinja = tmp_path / "served.jinja"
    text = (ROOT / "recipeforge" / "components" / "chat_templates" / "chatml.jinja").read_text()
    jinja.write_text(text.replace("{{- bos_token if bos_token else '' }}", ""))  # the server writes no BOS
    done = _rf(tmp_path, "check-template", str(TINY), "data.chat_template=chatml", "--serve", str(jinja))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "data.chat_template" in done.stderr and "'<|bos|>'" in done.stderr and "token 0" in done.stderr


def test_a_missing_serving_side_is_exit_2(tmp_path):
    done = _rf(tmp_path, "check-template", str(TINY), "--serve", str(tmp_path / "nowhere.jinja"))
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--serve" in done.stderr
