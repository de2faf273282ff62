"""The local hardware probe reads `nvidia-smi` (a script standing in for it, run as a program; the rest of
the hardware specs: tests/unit/plan/test_plan_hardware.py)."""

from __future__ import annotations

import os
import stat

import pytest

from recipeforge.plan import hardware, probe_local_hardware


def test_probe_reads_nvidia_smi(monkeypatch, tmp_path):
    # A stand-in nvidia-smi that answers like the real one for two H100s.
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559, 9.0'\necho 'NVIDIA H100 80GB HBM3, 81559, 9.0'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(hardware, "_probe_nvml", lambda: None)
    hw = probe_local_hardware()
    assert hw.gpus_per_node == 2 and hw.accelerator.name == "H100-80GB"
    assert hw.accelerator.memory_gb == pytest.approx(79.6, abs=0.1)
