"""recipeforge/backends/deepspeed_ops.py: which of DeepSpeed's extensions a run builds, and the lock a
stopped build leaves (torch's `lock` file holds no process id, so DeepSpeed would wait on it for ever)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from recipeforge.backends import deepspeed_ops
from recipeforge.errors import RecipeError


def test_a_run_builds_only_what_it_loads():
    assert deepspeed_ops.needed(on_cpu=False, offload_optimizer=False) == ()
    assert deepspeed_ops.needed(on_cpu=False, offload_optimizer=True) == ("CPUAdamBuilder",)
    assert deepspeed_ops.needed(on_cpu=True, offload_optimizer=False) == ("ShareMemCommBuilder",)
    assert deepspeed_ops.needed(on_cpu=True, offload_optimizer=True) == ("CPUAdamBuilder", "ShareMemCommBuilder")


def _stopped_build(tmp_path, age_s: float):
    build = tmp_path / "cpu_adam"
    build.mkdir()
    (build / "build.ninja").write_text("")
    lock = build / "lock"
    lock.write_text("")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return build, lock


def test_in_its_own_cache_a_lock_found_under_the_guard_is_removed_and_said(tmp_path):
    said = []
    build, lock = _stopped_build(tmp_path, age_s=5)
    assert deepspeed_ops.clear_stale_lock(build, own_folder=True, log=said.append)
    assert not lock.exists() and (build / "build.ninja").exists()  # only the lock goes
    assert said and str(lock) in said[0] and "stopped half-way" in said[0]


def test_in_a_folder_given_by_the_environment_a_young_lock_is_named_and_kept(tmp_path):
    said = []
    build, lock = _stopped_build(tmp_path, age_s=60)
    assert not deepspeed_ops.clear_stale_lock(build, own_folder=False, log=said.append)
    assert lock.exists()  # another program's build may be under way
    assert str(lock) in said[0] and "delete it" in said[0]


def test_in_a_folder_given_by_the_environment_an_old_lock_stops_the_run_and_is_kept(tmp_path):
    build, lock = _stopped_build(tmp_path, age_s=deepspeed_ops.FOREIGN_STALE_S + 60)
    with pytest.raises(RecipeError) as info:
        deepspeed_ops.clear_stale_lock(build, own_folder=False, log=print)
    assert lock.exists()  # the user's folder: recipeforge deletes nothing there
    text = info.value.render()
    assert str(lock) in text and "stopped half-way" in text and f"rm {lock}" in text


def test_no_lock_no_word(tmp_path):
    said = []
    assert not deepspeed_ops.clear_stale_lock(tmp_path / "never-built", own_folder=True, log=said.append)
    assert said == []


def test_the_guard_lets_one_builder_in_at_a_time(tmp_path):
    inside, order = threading.Event(), []

    def second():
        inside.wait()
        with deepspeed_ops.build_guard(tmp_path):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with deepspeed_ops.build_guard(tmp_path):
        inside.set()
        time.sleep(0.3)
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]
