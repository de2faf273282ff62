"""`recipeforge ui` as a user types it: --help needs neither Starlette nor uvicorn, a missing `ui` extra is a
short error naming it, and the server started on a port of its choice answers the page, refuses the API
without the page's token, and stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_help_imports_neither_starlette_nor_uvicorn():
    code = textwrap.dedent("""
        import sys
        from recipeforge.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        try:
            main(["ui", "--help"])
        except SystemExit:
            pass
        print("WEB", sorted(m for m in ("starlette", "uvicorn", "httpx") if m in sys.modules))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "WEB []" in proc.stdout and "--key-env" in proc.stdout and "  ui " in proc.stdout


def test_without_the_ui_extra_the_command_names_it(tmp_path):
    code = textwrap.dedent("""
        import sys
        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("starlette", "uvicorn"):
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, Missing())
        from recipeforge.cli import main
        sys.exit(main(["ui", "runs"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: recipeforge ui needs Starlette and uvicorn: pip install 'recipeforge[ui]'"
    assert not (tmp_path / "runs").exists()


def test_the_server_answers_the_page_and_stops_on_sigterm(tmp_path):
    pytest.importorskip("uvicorn")
    server = subprocess.Popen([sys.executable, "-m", "recipeforge", "ui", "runs", "--port", "0"], cwd=tmp_path, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, (line, server.stderr.read() if server.poll() is not None else "")
        page = urllib.request.urlopen(url.group(0), timeout=30).read().decode()
        assert '<script src="/assets/chart.min.js">' in page
        token = re.search(r'name="recipeforge-token" content="([^"]+)"', page).group(1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.group(0) + "api/runs", timeout=30)
        assert refused.value.code == 403
        request = urllib.request.Request(url.group(0) + "api/runs", headers={"X-RecipeForge-Token": token})
        assert b'"runs":[]' in urllib.request.urlopen(request, timeout=30).read()
        assert (tmp_path / "runs").is_dir()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
    # uvicorn shuts down gracefully, then ends by the signal it caught (its default action), as servers do.
    assert code in (0, -signal.SIGTERM) and "Traceback" not in (server.stderr.read() if server.stderr else "")
