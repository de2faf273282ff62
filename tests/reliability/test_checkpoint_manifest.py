"""A damaged checkpoint never blocks a run: published checkpoints carry a manifest (path, size, hash of
every file), a resume verifies it, and a checkpoint that fails is renamed aside (never deleted) while the
run resumes from the newest one that verifies. A damaged checkpoint named by `output.resume` is a user
error naming the file. Checkpoints written before manifests existed still resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipeforge.cli import main
from recipeforge.errors import RecipeError
from recipeforge.outputs import checkpoint as ck
from recipeforge.outputs import manifest as mf
from recipeforge.outputs.atomic import write_marker

TINY = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny"


def _safetensors(path: Path, n: int = 64) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.arange(n, dtype=torch.float32)}, str(path))


def _checkpoint(root: Path, step: int, *, manifest: bool = True) -> Path:
    """A published-looking checkpoint: weights, trainer state, optimizer bytes, marker (+ manifest)."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    _safetensors(path / "model.safetensors")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "optimizer.pt").write_bytes(os.urandom(4096))
    if manifest:
        mf.write_manifest(path, skip=(ck.MARKER,))
    write_marker(path, step, manifest=mf.MANIFEST if manifest else None)
    return path


# ----------------------------------------------------------------------------- the manifest

def test_manifest_lists_every_file_and_verifies(tmp_path):
    path = _checkpoint(tmp_path, 4)
    data = json.loads((path / mf.MANIFEST).read_text())
    assert sorted(e["path"] for e in data["files"]) == ["model.safetensors", "optimizer.pt", "trainer_state.json"]
    assert all(e["method"] == "blake2b" and e["size"] > 0 for e in data["files"])
    assert json.loads((path / ck.MARKER).read_text()) == {"step": 4, "manifest": mf.MANIFEST}
    assert ck.verify_checkpoint(path) == []


@pytest.mark.parametrize("damage, expected", [
    (lambda p: os.truncate(p / "model.safetensors", 20), "model.safetensors: 20 bytes, the manifest says"),
    (lambda p: (p / "trainer_state.json").unlink(), "trainer_state.json: missing"),
    (lambda p: (p / "optimizer.pt").write_bytes(b"\0" * 4096), "optimizer.pt: contents differ from the manifest"),
    (lambda p: (p / mf.MANIFEST).unlink(), "checkpoint_manifest.json: missing"),
])
def test_damage_is_named_by_file(tmp_path, damage, expected):
    path = _checkpoint(tmp_path, 4)
    damage(path)
    problems = ck.verify_checkpoint(path)
    assert problems and problems[0].startswith(expected), problems


def test_large_files_are_hashed_by_sampling(tmp_path, monkeypatch):
    monkeypatch.setattr(mf, "FULL_HASH_LIMIT", 3 * mf.BLOCK)
    big = tmp_path / "optimizer.pt"
    big.write_bytes(os.urandom(10 * mf.BLOCK))
    method, digest = mf.file_hash(big)
    assert method == "blake2b-sampled"
    with open(big, "r+b") as fh:  # a zero-filled tail is seen
        fh.seek(9 * mf.BLOCK)
        fh.write(b"\0" * mf.BLOCK)
    assert mf.file_hash(big) != (method, digest)


def test_checkpoints_without_a_manifest_are_checked_for_what_can_be(tmp_path):
    good = _checkpoint(tmp_path, 2, manifest=False)
    assert json.loads((good / ck.MARKER).read_text()) == {"step": 2}  # the older marker format
    assert ck.verify_checkpoint(good) == []
    cut = _checkpoint(tmp_path, 4, manifest=False)
    os.truncate(cut / "model.safetensors", (cut / "model.safetensors").stat().st_size - 10)
    assert any(p.startswith("model.safetensors:") and "truncated" in p for p in ck.verify_checkpoint(cut))
    stateless = _checkpoint(tmp_path, 6, manifest=False)
    (stateless / "trainer_state.json").unlink()
    assert ck.verify_checkpoint(stateless) == ["trainer_state.json: missing"]


def test_resume_skips_damaged_checkpoints_and_keeps_them(tmp_path):
    _checkpoint(tmp_path, 2)
    four = _checkpoint(tmp_path, 4, manifest=False)
    six = _checkpoint(tmp_path, 6)
    os.truncate(six / "model.safetensors", 10)
    (four / "trainer_state.json").unlink()
    said: list[str] = []
    chosen = ck.resume_checkpoint("auto", tmp_path, verify=True, log=said.append)
    assert chosen == tmp_path / "checkpoint-2"
    aside = sorted(p.name for p in tmp_path.iterdir() if ck.CORRUPT in p.name)
    assert [name.split(ck.CORRUPT)[0] for name in aside] == ["checkpoint-4", "checkpoint-6"]
    assert "checkpoint-6 is damaged" in said[0] and "model.safetensors: 10 bytes" in said[0]
    assert "trainer_state.json: missing" in said[1]
    # set aside: invisible to resume and rotation, files kept
    assert [p.name for p in ck.checkpoints(tmp_path)] == ["checkpoint-2"]
    assert all((tmp_path / name / "optimizer.pt").is_file() for name in aside)


def test_a_named_damaged_checkpoint_is_a_user_error(tmp_path):
    path = _checkpoint(tmp_path, 4)
    os.truncate(path / "model.safetensors", 10)
    with pytest.raises(RecipeError) as info:
        ck.resume_checkpoint(str(path), tmp_path, verify=True)
    assert "model.safetensors: 10 bytes" in str(info.value) and info.value.problems[0].key == "output.resume"
    assert path.is_dir()  # a named checkpoint is left where it is


# ----------------------------------------------------------------------------- end to end

def _train(tmp_path, capsys, *extra):
    code = main(["train", str(TINY / "pretrain.yaml"), f"output.dir={tmp_path / 'run'}",
                 f"data.cache_dir={tmp_path / 'cache'}", "logging.progress_bar=false", "train.max_steps=6",
                 "output.save_steps=2", "output.save_total_limit=null", "data.val_size=0", *extra])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_a_run_resumes_past_a_damaged_newest_checkpoint(tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    code, err = _train(tmp_path, capsys)
    assert code == 0, err
    ckpts = run / "checkpoints"
    assert json.loads((ckpts / "checkpoint-6" / ck.MARKER).read_text())["manifest"] == mf.MANIFEST

    # The newest checkpoint's weights cut short (a disk that filled up, a copy that stopped).
    shutil.rmtree(run / "final")
    os.truncate(ckpts / "checkpoint-6" / "model.safetensors", 1000)
    code, err = _train(tmp_path, capsys)
    assert code == 0, err
    assert f"checkpoint {ckpts / 'checkpoint-6'} is damaged" in err and "model.safetensors: 1000 bytes" in err
    assert f"resuming from {ckpts / 'checkpoint-4'}" in err
    assert (run / "final" / "model.safetensors").is_file()
    assert len(list(ckpts.glob(f"checkpoint-6{ck.CORRUPT}*"))) == 1  # kept for inspection
    assert ck.verify_checkpoint(ckpts / "checkpoint-6") == []      # the step trained again, published anew

    # Named explicitly, a damaged checkpoint stops the run before anything is touched: exit 2.
    shutil.rmtree(run / "final")
    (ckpts / "checkpoint-4" / "trainer_state.json").unlink()
    before = (run / "metrics.jsonl").read_text()
    code, err = _train(tmp_path, capsys, f"output.resume={ckpts / 'checkpoint-4'}")
    assert code == 2 and "Traceback" not in err
    assert "output.resume: cannot resume from" in err and "trainer_state.json: missing" in err
    assert (run / "metrics.jsonl").read_text() == before and not (run / "final").exists()

    # resume: auto passes over it (checkpoint-6 verifies, so it is chosen; 4 is never looked at).
    code, err = _train(tmp_path, capsys)
    assert code == 0, err
    assert f"resuming from {ckpts / 'checkpoint-6'}" in err
