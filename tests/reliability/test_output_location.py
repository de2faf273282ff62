"""An output location the run cannot or must not write is refused before any work (exit 2, located,
no traceback), and a disk that fills while the run is written ends it with exit 2, the last complete
checkpoint intact.

Read-only mounts and full disks are real: a tmpfs mounted in a private mount namespace (`unshare -m`,
root only). Missing permissions are real too: the check runs as user `nobody` (`setpriv`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipeforge.cli import main
from recipeforge.errors import RecipeError
from recipeforge.outputs.preflight import check_output_location, planned_output, write_failure

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "examples" / "yaml" / "tiny" / "sft-full.yaml"
OK = """\
stage: sft
model: {name_or_path: tiny:llama}
hardware: {gpus_per_node: 0}
data:
  datasets:
    - {path: rows.jsonl, format: alpaca}
train: {global_batch_size: 4, max_steps: 1}
"""
ROWS = '{"instruction": "What does the cow say?", "input": "", "output": "moo"}\n' * 4


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -m (private tmpfs mounts)")


@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "r.yaml").write_text(OK)
    (tmp_path / "rows.jsonl").write_text(ROWS)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    start = err.find("error: ")
    assert start == 0 or (start > 0 and err[start - 1] == "\n"), err
    return err[start:]


CASES = [
    # (id, output.dir, extra args, message, hint)
    ("existing-file", "a-file", (), "is an existing file, not a folder", "a file stands where a folder"),
    ("below-a-file", "a-file/run", (), "a-file is a file, not a folder", "a file stands where a folder"),
    ("below-a-file-deeper", "a-file/x/y", (), "a-file is a file, not a folder", ""),
    ("proc", "/proc/recipeforge-run", (), "cannot be created in /proc", ""),
    ("sys", "/sys/recipeforge-run", (), "cannot be created in /sys: Operation not permitted",
     "may not write /sys"),
    ("device-file", "/dev/null/run", (), "/dev/null is a file, not a folder", ""),
    ("root", "/", (), "is the file system root: a run directory must be a folder of its own", "runs/<name>"),
    ("dot", ".", (), "is the working directory", "--overwrite deletes it"),
    ("dot-slash", "./", (), "is the working directory", ""),
    ("parent-of-cwd", "..", (), "is a parent of the working directory", ""),
    ("sub-dot-dot", "sub/..", (), "is the working directory", ""),
    ("too-long-name", "x" * 300, (), "bytes long, the file system allows 255", "shorter path"),
    ("foreign-overwrite", "foreign", ("--overwrite",), "holds 1 entries that are not a recipeforge run (e.g. "
                                                       "'notes.txt'), and --overwrite would delete them", ""),
]


@pytest.mark.parametrize("out, extra, message, hint", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_before_any_work(work, capsys, out, extra, message, hint):
    before = sorted(p.name for p in work.iterdir())
    assert main(["train", "r.yaml", f"output.dir={out}", *extra]) == 2
    err = _err(capsys)
    first = err.splitlines()[0]
    assert first.startswith("error: <cli output.dir=") and " output.dir: " in first, err
    assert message in err and hint in err, err
    assert sorted(p.name for p in work.iterdir()) == before  # nothing written anywhere
    assert (work / "foreign" / "notes.txt").read_text() == "mine"


def test_home_and_recipe_folder(work, capsys, monkeypatch):
    home = work / "home"
    (home / "proj").mkdir(parents=True)
    shutil.copy(work / "r.yaml", home / "proj" / "r.yaml")
    shutil.copy(work / "rows.jsonl", home / "proj" / "rows.jsonl")
    monkeypatch.setenv("HOME", str(home))
    for out in ("~/", str(home), f"{home}/proj/.."):
        assert main(["train", str(home / "proj" / "r.yaml"), f"output.dir={out}"]) == 2
        assert "is the home directory" in _err(capsys)
    assert main(["train", str(home / "proj" / "r.yaml"), f"output.dir={home / 'proj'}"]) == 2
    assert "is the recipe's folder" in _err(capsys)
    recipe_in_sub = home / "proj" / "recipes" / "r.yaml"
    recipe_in_sub.parent.mkdir()
    recipe_in_sub.write_text(OK.replace("rows.jsonl", str(home / "proj" / "rows.jsonl")))
    assert main(["train", str(recipe_in_sub), f"output.dir={home / 'proj'}"]) == 2
    assert f"is a parent of the recipe's folder ({recipe_in_sub.parent})" in _err(capsys)


def test_through_the_real_command_line(work):
    for out in ("a-file", "/", "/proc/run"):
        proc = subprocess.run([sys.executable, "-m", "recipeforge", "train", "r.yaml", f"output.dir={out}"],
                              capture_output=True, text=True, cwd=work)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and lines[0].startswith(f"error: <cli output.dir={out}> output.dir: "), proc.stderr


def test_writing_elsewhere_fails_as_a_user_error(work):
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "resolve", "r.yaml", "-o", "/sys/resolved.yaml"],
                          capture_output=True, text=True, cwd=work)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "cannot write /sys/resolved.yaml" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or not Path("/usr/bin/python3").exists(),
                    reason="needs root to run the check as another user")
def test_no_permission_as_another_user(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    tmp_path.chmod(0o755)
    code = ("from pathlib import Path\nfrom recipeforge.errors import RecipeError\n"
            "from recipeforge.outputs.preflight import check_output_location\n"
            f"try:\n    check_output_location(Path({str(locked / 'run')!r}))\n"
            "except RecipeError as exc:\n    print(exc.render())\n")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           code], capture_output=True, text=True, cwd="/",
                          env={"PYTHONPATH": str(REPO), "HOME": "/tmp", "PATH": "/usr/bin:/bin"})
    if "No module named" in proc.stderr:
        pytest.skip("the system python cannot import recipeforge's light modules")
    assert "cannot be created in" in proc.stdout and "Permission denied" in proc.stdout, proc.stdout + proc.stderr
    assert "may not write" in proc.stdout


def _in_tmpfs(mount: Path, options: str, command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    mount.mkdir(exist_ok=True)
    script = f"mount -t tmpfs -o {options} tmpfs {mount} && exec \"$@\""
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *command], capture_output=True, text=True,
                          cwd=cwd)


@needs_mounts
def test_read_only_file_system_is_refused_before_any_work(tmp_path):
    proc = _in_tmpfs(tmp_path / "mnt", "size=1m,ro", [sys.executable, "-m", "recipeforge", "train", str(SFT),
                                                        f"output.dir={tmp_path / 'mnt' / 'run'}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot be created in" in proc.stderr and "Read-only file system" in proc.stderr
    assert "read-only file system: set output.dir to a writable location" in proc.stderr
    assert "[recipeforge] data:" not in proc.stderr  # refused before the data was read


@needs_mounts
def test_disk_full_mid_run_keeps_the_last_checkpoint(tmp_path):
    """4 MB hold one checkpoint of the tiny model (2.5 MB), not two: the second save fails. The run's
    files are listed inside the same mount namespace, after the failure."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run = mnt / "run"
    listing = tmp_path / "listing.json"
    read = (f"import json,pathlib; r=pathlib.Path({str(run)!r}); "
            f"pathlib.Path({str(listing)!r}).write_text(json.dumps(sorted(str(p.relative_to(r)) for p in "
            f"r.rglob('*') if '.staging' not in p.parts)))")
    script = (f"mount -t tmpfs -o size=4m tmpfs {mnt} && {sys.executable} -m recipeforge train {SFT} "
              f"output.dir={run} data.cache_dir={tmp_path / 'cache'} train.max_steps=6 output.save_steps=2 "
              f"logging.progress_bar=false; echo $? > {tmp_path / 'rc'}; {sys.executable} -c \"{read}\"")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    err = proc.stderr
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert "Traceback" not in err and "internal error" not in err
    assert "warning: output.dir" in err and "free on its disk, and this run may write about" in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert f"writing the run directory {run} failed: no space left on device" in errors[0]
    assert "the last complete checkpoint is intact (checkpoints/checkpoint-2), final/ was not written" in errors[0]
    assert "hint: free space on the disk holding" in err
    files = json.loads(listing.read_text())
    assert "checkpoints/checkpoint-2/checkpoint_complete.json" in files
    assert "checkpoints/checkpoint-2/model.safetensors" in files
    assert not any(f.startswith(("final", "checkpoints/checkpoint-4")) for f in files)


# -- the pieces, on real errors ----------------------------------------------------------------------

@pytest.mark.parametrize("exc, code", [
    (OSError(errno.ENOSPC, "No space left on device", "/r/checkpoints/x"), errno.ENOSPC),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "/r/final/x"), errno.EDQUOT),
    (PermissionError(errno.EACCES, "Permission denied", "/r/plan.json"), errno.EACCES),
    (OSError(errno.EROFS, "Read-only file system", "/r/x"), errno.EROFS),
    (FileExistsError(errno.EEXIST, "File exists", "/r"), errno.EEXIST),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/r/x"), errno.ENOTDIR),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/r/x"), errno.EISDIR),
    (OSError(errno.ENAMETOOLONG, "File name too long", "/r/x"), errno.ENAMETOOLONG),
    (OSError(errno.EPERM, "Operation not permitted", "/r/x"), errno.EPERM),
    # What safetensors and torch raise (messages as seen on a full / read-only tmpfs).
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"), errno.ENOSPC),
    (RuntimeError('Error while serializing: I/O error: Read-only file system (os error 30) at path "/r/m"'),
     errno.EROFS),
    (RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: Read-only file "
                  "system"), errno.EROFS),
])
def test_failed_writes_become_user_errors(exc, code):
    failure = write_failure(exc, Path("/r"))
    assert isinstance(failure, RecipeError)
    (problem,) = failure.problems
    assert os.strerror(code).lower() in problem.message and problem.key == "output.dir"
    assert "final/ was not written" in problem.message and problem.hint


def test_torch_stream_writer_failure_without_errno(tmp_path):
    exc = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    exc.__context__ = RuntimeError("basic_ios::clear: iostream error")
    failure = write_failure(exc, tmp_path)
    assert failure is not None and f"writing the run directory {tmp_path} failed" in str(failure)


@pytest.mark.parametrize("exc", [OSError(errno.ENOENT, "No such file"), RuntimeError("CUDA error: operation not "
                                                                                       "permitted"), ValueError("x"),
                                 RecipeError("already a user error")])
def test_other_errors_stay_as_they_are(exc):
    assert write_failure(exc, Path("/r")) is None


def test_inside_a_dataset_and_free_space(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(RecipeError, match="is inside the dataset directory"):
        check_output_location(data / "run", datasets=[("data.datasets[0]", data)])
    logged = []

    class Plan:
        backend = "single"
        from recipeforge.plan.types import BackendTraits, PlanExtras

        extra = PlanExtras(model={"params": 10**15, "trainable_params": 10**15}, dtype="bf16")
        traits = BackendTraits()

    from recipeforge.config import load_recipe

    recipe = load_recipe(SFT).recipe
    planned = planned_output(Plan(), recipe)
    # 2 bytes of weights + 8 of Adam state per parameter, save_total_limit 2 (+1 being saved), final.
    assert planned.total == 3 * 10 * 10**15 + 2 * 10**15
    check_output_location(tmp_path / "run", planned=planned, log=logged.append)
    assert len(logged) == 1 and "3 checkpoints of 10000.00 TB: output.save_total_limit 2 plus one" in logged[0]
    assert not (tmp_path / "run").exists()  # checking creates nothing


def test_a_runs_own_resolved_recipe_continues_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_recipe.yaml").write_text("stage: sft\n")
    (run / "other.yaml").write_text("stage: sft\n")
    check_output_location(run, recipe_path=run / "resolved_recipe.yaml")
    with pytest.raises(RecipeError, match="is the recipe's folder"):
        check_output_location(run, recipe_path=run / "other.yaml")
