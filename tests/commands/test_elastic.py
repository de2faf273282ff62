"""`recipeforge validate` refuses a rendezvous no node could find, located, exit 2, run as a user types it
(the launcher arguments: tests/unit/backends/test_elastic.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("lines, key, fragment", [
    ("distributed:\n  rdzv_backend: c10d\nhardware:\n  nodes: 2\n  gpus_per_node: 8\n", "distributed.rdzv_backend",
     "rdzv_backend c10d needs a c10d store shared by the 2 nodes"),
    ("distributed:\n  rdzv_backend: etcd\n", "distributed.rdzv_backend", "rdzv_backend etcd needs an etcd server"),
    ("distributed:\n  rdzv_endpoint: 'node001:99999'\n", "distributed.rdzv_endpoint", "is not host:port"),
    ("distributed:\n  max_restarts: -1\n", "distributed.max_restarts", ">= 0"),
])
def test_validate_refuses_a_rendezvous_no_node_can_find(tmp_path, lines, key, fragment):
    from rf_testing import MINIMAL

    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL + lines)
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    line = MINIMAL.count("\n") + 2  # the key's own line, under distributed:
    assert f"{path}:{line}:3 {key}: " in proc.stderr and fragment in proc.stderr, proc.stderr
