"""One run per run directory, and one builder per tokenized-data cache entry.

A second `train` into a directory in use is refused with exit 2 naming the holder (pid, host, since
when); a lock left by a killed run is taken over with a message; workers launched by the holder are not
refused. Two processes asking for the same cache entry build it once: the second waits and reads it;
an unreadable entry is rebuilt instead of blocking every later run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipeforge.errors import RecipeError
from recipeforge.outputs import run_lock

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "yaml" / "tiny"

HOLD = """\
import sys, time
from recipeforge.outputs import run_lock
run_lock.acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_held_directory_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RecipeError) as info:
            run_lock.acquire(run)
        text = str(info.value)
        assert f"run directory {run} is in use by another run: pid {holder.pid} on host " \
               f"{socket.gethostname()}, since " in text
        assert info.value.problems[0].key == "output.dir"
    finally:
        holder.kill()
        holder.wait()
    # Killed without releasing: the kernel dropped its lock; the next run takes it over and says whose.
    said: list[str] = []
    lock = run_lock.acquire(run, log=said.append)
    try:
        assert len(said) == 1 and f"from pid {holder.pid} on {socket.gethostname()}" in said[0]
        assert "ended without releasing it" in said[0]
        assert json.loads((run / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        run_lock.release_all()
    assert not (run / run_lock.LOCK_NAME).exists()


def test_a_wiped_directory_is_locked_again(tmp_path):
    run = tmp_path / "run"
    run_lock.acquire(run)
    try:
        shutil.rmtree(run)  # what --overwrite does
        run.mkdir()
        run_lock.reassert(run)
        assert run_lock.held(run).still_ours()
        holder_code = subprocess.run([sys.executable, "-c", HOLD, str(run)], capture_output=True, text=True,
                                     timeout=60)
        assert holder_code.returncode != 0 and "is in use by another run" in holder_code.stderr
    finally:
        run_lock.release_all()


def _train(recipe: Path, run: Path, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "recipeforge", "train", str(recipe), f"output.dir={run}", f"data.cache_dir={cache}",
            "logging.progress_bar=false", "train.logging_steps=1", "train.micro_batch_size=auto", *extra]


@pytest.mark.slow
def test_a_second_train_into_a_busy_directory_exits_2(tmp_path):
    run, cache = tmp_path / "run", tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(_train(TINY / "pretrain.yaml", run, cache, "train.max_steps=3000", "output.save_steps=5000",
                                    "--nproc-per-node", "2"),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ((run / "metrics.jsonl").exists() and '"loss"' in (run / "metrics.jsonl").read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.2)  # its two workers are training: they were not refused by their parent's lock
        recipe_before = (run / "resolved_recipe.yaml").read_text()
        second = subprocess.run(_train(TINY / "pretrain.yaml", run, cache, "train.max_steps=3000",
                                       "output.save_steps=5000"),
                                env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        assert re.search(rf"output\.dir: run directory {re.escape(str(run))} is in use by another run: "
                         rf"pid {first.pid} on host {re.escape(socket.gethostname())}, since \d{{4}}-", second.stderr)
        assert "Traceback" not in second.stderr and (run / "resolved_recipe.yaml").read_text() == recipe_before
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert not (run / run_lock.LOCK_NAME).exists()


# ----------------------------------------------------------------------------- the data cache

def _preprocess(cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "recipeforge", "preprocess", str(TINY / "sft-full.yaml"),
                             f"data.cache_dir={cache}"], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stats(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def _waiting_on(lock_file: Path) -> int:
    """How many processes wait for the flock of `lock_file` (from /proc/locks)."""
    ino = lock_file.stat().st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and line.split()[-3].endswith(f":{ino}"))


@pytest.mark.slow
def test_concurrent_builders_of_one_cache_entry_build_it_once(tmp_path):
    fingerprint = _stats(_preprocess(tmp_path / "first"))["fingerprint"]
    cache = tmp_path / "cache"
    lock_file = cache / "tokenized" / f".{fingerprint}.lock"
    with run_lock.exclusive(lock_file):  # a builder at work: both newcomers must wait for it
        procs = [_preprocess(cache), _preprocess(cache)]
        deadline = time.monotonic() + 120
        while _waiting_on(lock_file) < 2:
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
                [p.communicate()[1][-2000:] for p in procs]
            time.sleep(0.2)
    results = sorted(_stats(p)["cache"] for p in procs)
    assert results == ["hit", "miss"]  # one built it, the other read what it wrote
    assert [p.name for p in (cache / "tokenized").iterdir() if not p.name.startswith(".")] == [fingerprint]


@pytest.mark.slow
def test_an_unreadable_cache_entry_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    stats = _stats(_preprocess(cache))
    entry = Path(stats["cache_path"])
    (entry / "stats.json").unlink()  # e.g. a copy that was cut short
    assert _stats(_preprocess(cache))["cache"] == "miss"
    assert (entry / "stats.json").is_file()
    assert _stats(_preprocess(cache))["cache"] == "hit"  # healed, not rebuilt on every run
