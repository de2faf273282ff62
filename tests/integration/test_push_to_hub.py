"""`output.push_to_hub` and `recipeforge push`: exactly the model folder and the model card go up
(never checkpoints, optimizer states, logs or the run lock), and an upload that cannot happen
(offline, no token, unreachable endpoint) is one clear line with the command that retries, while the
finished run stays complete on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = ("train.max_steps=6", "train.logging_steps=1", "output.save_steps=3")


@pytest.fixture(scope="module")
def merged_run(tiny, tmp_path_factory):
    run = tiny.train("sft-lora", tmp_path_factory.mktemp("push") / "run", *STEPS, "output.merge_adapter=true")
    losses = tiny.values(run, "loss")
    assert losses[-1] < losses[0]  # it trained
    return run


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                "HF_HOME": str(tmp_path / "hf-home"), **env}
    if "HF_TOKEN" not in env:
        full_env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "recipeforge", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=full_env, timeout=600)


def test_the_merged_model_and_its_card_are_all_that_goes_up(merged_run):
    from recipeforge.tools.hub import push_plan

    plan = push_plan(merged_run)
    assert plan.source == merged_run / "merged"
    uploaded = set(plan.paths_in_repo())
    assert uploaded == {p.relative_to(merged_run / "merged").as_posix()
                        for p in (merged_run / "merged").rglob("*") if p.is_file()} | {"README.md", "loss.png"}
    assert "model.safetensors" in uploaded and "config.json" in uploaded
    assert dict((dest, src) for src, dest in plan.files)["README.md"] == merged_run / "README.md"
    assert dict((dest, src) for src, dest in plan.files)["loss.png"] == merged_run / "loss.png"  # the card's plot
    # Nothing of the training state, the logs or the run's bookkeeping.
    sources = {src for src, _ in plan.files}
    assert (merged_run / "checkpoints").is_dir() and (merged_run / "logs").is_dir()
    assert not any(s.is_relative_to(merged_run / d) for s in sources
                   for d in ("checkpoints", "logs", "final", "base_model"))
    assert not any("optimizer" in d or d.startswith(".") or d.endswith(".lock") for d in uploaded)


def test_without_a_merge_the_adapter_goes_up_with_a_note_about_its_local_base(merged_run):
    from recipeforge.tools.hub import push_plan

    plan = push_plan(merged_run, merged=False)
    assert set(plan.paths_in_repo()) >= {"adapter_model.safetensors", "adapter_config.json", "README.md"}
    assert "model.safetensors" not in plan.paths_in_repo()
    assert any("merge_adapter" in note for note in plan.notes)  # a tiny model's base is a local folder


def test_push_offline_is_one_line_with_the_retry_command(merged_run, tmp_path):
    proc = _cli(tmp_path, "push", str(merged_run), "--repo-id", "me/tiny", HF_HUB_OFFLINE="1", HF_TOKEN="hf_x" * 8)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "offline mode is on (HF_HUB_OFFLINE=1)" in proc.stderr
    assert f"then retry: recipeforge push {merged_run} --repo-id me/tiny" in proc.stderr


def test_push_without_a_token_or_a_reachable_endpoint(merged_run, tmp_path):
    proc = _cli(tmp_path, "push", str(merged_run), "--repo-id", "me/tiny", HF_HUB_OFFLINE="0")
    assert proc.returncode == 2 and "no Hugging Face token" in proc.stderr, proc.stderr
    # A token, and an endpoint where nothing listens: the connection error, in one line.
    proc = _cli(tmp_path, "push", str(merged_run), "--repo-id", "me/tiny", HF_HUB_OFFLINE="0",
                HF_TOKEN="hf_" + "x" * 34, HF_ENDPOINT="http://127.0.0.1:9")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"pushing {merged_run / 'merged'} to me/tiny failed" in error[0], proc.stderr
    assert "hf_xxxx" not in proc.stderr


def test_push_needs_a_repository(merged_run, tmp_path):
    proc = _cli(tmp_path, "push", str(merged_run), HF_HUB_OFFLINE="1")
    assert proc.returncode == 2 and "--repo-id" in proc.stderr and "Traceback" not in proc.stderr
