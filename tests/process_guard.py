"""The default tier (tests/unit, tests/plan) runs in this process only: a test there that starts another
process (subprocess, multiprocessing, os.fork/posix_spawn/system) fails, naming what it started.

While such a test sets up, runs and tears down, every way Python has to start a process is replaced by
one that raises `ProcessStarted` (a BaseException, so an `except Exception` in the code under test does
not swallow it) and records the attempt; the test then fails even where the exception was caught. Tests
that need a process of their own belong to another tier (tests/commands, tests/integration, ...).
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import platform
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
DEFAULT_TIER = (TESTS / "unit", TESTS / "plan")


# The standard library runs `uname -p` the first time anything asks for the processor name (platform.platform()
# does, in a run directory's environment.json), then keeps the answer for the life of the interpreter. Asked
# here once, so whichever test happens to ask first does not start a process on its behalf.
platform.processor()


# `ctypes.util.find_library` reads the linker's cache with `ldconfig -p` each time it is asked (bitsandbytes
# asks when it is imported): the standard library's lookup of a shared library, not a process of the test's.
def _library_lookup(args) -> bool:
    argv = list(args[0]) if args and isinstance(args[0], (list, tuple)) else []
    return len(argv) == 2 and Path(str(argv[0])).name == "ldconfig" and argv[1] == "-p"


class ProcessStarted(BaseException):
    """A default-tier test tried to start a process."""


def in_default_tier(path: str | Path) -> bool:
    path = Path(path).resolve()
    return any(path.is_relative_to(d) for d in DEFAULT_TIER)


@contextlib.contextmanager
def refuse_processes(nodeid: str):
    attempts: list[str] = []
    lookups = []  # non-empty while a library lookup's process starts (it goes through fork_exec too)

    def refusing(what: str, original):
        def refuse(*args, **kwargs):
            if what == "subprocess.Popen" and _library_lookup(args[1:]):
                lookups.append(True)
                try:
                    return original(*args, **kwargs)
                finally:
                    lookups.pop()
            if lookups and what.startswith("_posixsubprocess"):
                return original(*args, **kwargs)
            shown = what
            if what == "subprocess.Popen" and len(args) > 1:
                shown = f"{what}({args[1]!r})"
            attempts.append(shown)
            raise ProcessStarted(
                f"{nodeid} started a process ({shown}); the default tier (tests/unit, tests/plan) runs in "
                "this process only: move the test to a tier that allows processes (tests/commands, "
                "tests/integration, ...)")
        return refuse

    targets = [(subprocess.Popen, "_execute_child", "subprocess.Popen"),
               (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec (multiprocessing)")]
    targets += [(os, name, f"os.{name}") for name in
                ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve", "spawnvp",
                 "spawnvpe") if hasattr(os, name)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    for owner, name, what in targets:
        setattr(owner, name, refusing(what, getattr(owner, name)))
    try:
        yield attempts
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
    if attempts:
        raise ProcessStarted(f"{nodeid} started a process ({', '.join(attempts)}); the default tier "
                             "(tests/unit, tests/plan) runs in this process only")


def _guarded(item: pytest.Item):
    if not in_default_tier(item.path):
        return contextlib.nullcontext()
    return refuse_processes(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _guarded(item):
        return (yield)
