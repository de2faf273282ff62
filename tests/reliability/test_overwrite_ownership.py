"""Destruction needs ownership: `--overwrite` (and `merge -o`, which replaced its folder without asking)
deletes only a folder recipeforge wrote, recognised by its marker file; never the root, the home or
working directory, nor the run being exported or a folder holding it. `train` and `export` follow the one
rule. Staging folders are gone after an error, Ctrl-C or SIGTERM, and a SIGKILLed command's are removed
by the next command that stages beside them.

Every command runs with HOME set to a folder of the test's own, holding a `.ssh` key: a refusal that
failed could only ever delete that copy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipeforge.errors import RecipeError
from recipeforge.outputs.ownership import OWNER_FILE, STAGING_PREFIX, check_replaceable
from surface_testing import REPO, recipeforge, refused, tree

pytestmark = pytest.mark.slow

SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    return home


def test_export_and_merge_never_replace_a_place_of_the_users(full_run, lora_run, home, tmp_path):
    before = tree(home)
    work, papers = home / "work", home / "papers"
    work.mkdir()
    papers.mkdir()
    (papers / "notes.txt").write_text("mine")
    cases = [
        (["export", str(full_run), "--format", "safetensors", "-o", str(home), "--overwrite"], "is the home directory"),
        # merge had no --overwrite flag at all and replaced its -o folder silently
        (["merge", str(lora_run), "-o", str(home)], "is the home directory"),
        (["merge", str(lora_run), "-o", str(papers)], "entries recipeforge did not write (e.g. 'notes.txt'"),
        (["export", str(full_run), "--format", "safetensors", "-o", ".", "--overwrite"], "is the working directory"),
        (["export", str(full_run), "--format", "safetensors", "-o", str(full_run.parent), "--overwrite"],
         "is a parent of the run directory being exported"),
        (["export", str(full_run), "--format", "safetensors", "-o", str(papers), "--overwrite"],
         "entries recipeforge did not write"),
        (["merge", str(lora_run), "-o", str(lora_run)], "is the run directory"),
    ]
    for args, message in cases:
        refused(recipeforge(*args, *(["--no-check"] if args[0] == "export" else []), cwd=work, home=home), message)
    assert tree(home) == {**before, "papers/notes.txt": b"mine"}
    # The root is refused by the same rule (checked in this process: a failure here must not be a real one).
    with pytest.raises(RecipeError, match="file system root"):
        check_replaceable(Path("/"), overwrite=True, key="--output")


def test_what_recipeforge_wrote_is_replaced_and_staging_never_stays(full_run, home, tmp_path):
    out = tmp_path / "exports" / "model"
    done = recipeforge("export", str(full_run), "--format", "safetensors", "-o", str(out), "--no-check",
                       cwd=tmp_path, home=home)
    assert done.returncode == 0, done.stderr.decode()
    assert (out / OWNER_FILE).is_file() and (out / "model.safetensors").is_file()
    refused(recipeforge("export", str(full_run), "--format", "safetensors", "-o", str(out), "--no-check",
                        cwd=tmp_path, home=home), "already holds files", "--overwrite")
    # A staging folder a SIGKILLed export left behind (its process is gone) is removed by the next one.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = out.parent / f"{STAGING_PREFIX}{dead.pid}-model-x"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    done = recipeforge("export", str(full_run), "--format", "safetensors", "-o", str(out), "--overwrite",
                       "--no-check", cwd=tmp_path, home=home)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
    # SIGTERM mid-export (while the self-check loads the models): exit 143, no staging folder, `out` intact.
    kept = tree(out)
    proc = subprocess.Popen([sys.executable, "-m", "recipeforge", "export", str(full_run), "--format", "safetensors",
                             "-o", str(out), "--overwrite"], cwd=tmp_path, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home),
                                 "RECIPEFORGE_CACHE": str(Path.home() / ".cache" / "recipeforge")})
    deadline = time.monotonic() + 120
    while not any(p.name.startswith(STAGING_PREFIX) for p in out.parent.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, proc.stderr.read().decode()[-2000:]
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"] and tree(out) == kept


def test_train_overwrite_follows_the_same_rule(home, tmp_path):
    """A folder of the user's that merely looks like a run (final/, checkpoints/) is not deleted; one a run
    was pointed at keeps what it held; once only the run's files are left it is replaced."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"instruction": "What does the cow say?", "input": "", "output": "moo"}\n' * 8)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage: sft\nmodel: {name_or_path: tiny:llama}\nhardware: {gpus_per_node: 0}\n"
                      f"data:\n  datasets: [{{path: {rows}, format: alpaca}}]\n  cache_dir: {tmp_path / 'cache'}\n"
                      "train: {global_batch_size: 4, max_steps: 1}\nlogging: {progress_bar: false}\n")
    lookalike = tmp_path / "lookalike"
    (lookalike / "final").mkdir(parents=True)
    (lookalike / "checkpoints").mkdir()
    (lookalike / "final" / "thesis.tex").write_text("years of work")
    err = refused(recipeforge("train", str(recipe), f"output.dir={lookalike}", "--overwrite", cwd=tmp_path,
                              home=home), "not a recipeforge run", "--overwrite would delete them")
    assert "output.dir" in err and (lookalike / "final" / "thesis.tex").is_file()
    # A run pointed at a folder of the user's (allowed) records what the folder held ...
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("mine")
    done = recipeforge("train", str(recipe), f"output.dir={shared}", cwd=tmp_path, home=home)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # ... so --overwrite refuses while that is there.
    refused(recipeforge("train", str(recipe), f"output.dir={shared}", "--overwrite", cwd=tmp_path, home=home),
            "not a recipeforge run")
    assert (shared / "notes.txt").read_text() == "mine"
    # Once the user's file is gone the folder is the run's own: replaced.
    (shared / "notes.txt").unlink()
    trained = (shared / "final" / "model.safetensors").stat().st_mtime_ns
    done = recipeforge("train", str(recipe), f"output.dir={shared}", "--overwrite", cwd=tmp_path, home=home)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert (shared / OWNER_FILE).is_file() and (shared / "final" / "model.safetensors").stat().st_mtime_ns != trained
