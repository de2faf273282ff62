"""The default tier starts no process: every way Python has to start one is refused while a test of
tests/unit or tests/plan runs (tests/process_guard.py), and the refusal fails the test even where the code
under test catches it. These tests run under the guard themselves, so a way it missed would start a real
process and fail them."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from process_guard import ProcessStarted, in_default_tier, refuse_processes

TESTS = Path(__file__).resolve().parents[1]


def _nothing():
    pass


WAYS = {
    "subprocess.run": lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
    "subprocess.Popen": lambda: subprocess.Popen(["true"]).wait(),
    "os.system": lambda: os.system("true"),
    "os.posix_spawn": lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], dict(os.environ)), 0),
    "os.fork": lambda: os.fork(),
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=_nothing).start(),
    "multiprocessing forkserver": lambda: multiprocessing.get_context("forkserver").Process(target=_nothing).start(),
    "multiprocessing fork": lambda: multiprocessing.get_context("fork").Process(target=_nothing).start(),
}


@pytest.mark.parametrize("way", WAYS)
def test_every_way_to_start_a_process_is_refused(way):
    with pytest.raises(ProcessStarted, match="started a process"):
        with refuse_processes("a test"):
            WAYS[way]()


def test_a_refusal_the_code_catches_still_fails_the_test():
    with pytest.raises(ProcessStarted, match=r"a test started a process \(subprocess.Popen\(\['true'\]\)\)"):
        with refuse_processes("a test"):
            try:
                subprocess.run(["true"])
            except BaseException:  # noqa: BLE001 - code under test that swallows everything
                pass


def test_the_guard_covers_the_default_tier_only():
    assert in_default_tier(TESTS / "unit" / "cli" / "test_cli.py") and in_default_tier(TESTS / "plan" / "x.py")
    for other in ("commands", "integration", "reliability", "floors"):
        assert not in_default_tier(TESTS / other / "test_x.py")
    assert in_default_tier(__file__)  # this very test runs under it


def test_the_standard_librarys_library_lookup_is_let_through():
    # ctypes.util.find_library reads `ldconfig -p` (bitsandbytes' import asks it); ldconfig asked anything
    # else is a process like any other.
    import ctypes.util

    with refuse_processes("a test"):
        assert ctypes.util.find_library("c")
    with pytest.raises(ProcessStarted, match="ldconfig"):
        with refuse_processes("a test"):
            subprocess.run(["/sbin/ldconfig", "-v"])
