"""`data.streaming` as users run it: `recipeforge train` on a corpus larger than the cache's disk, on two
processes, killed and resumed: every process trains on its own rows, and the resumed run neither
repeats nor skips one (`data.stream_log` says which rows each step trained on)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
WORDS = "the cow dog cat says moo woof meow one two three red blue green apple banana sun moon".split()
TMPFS_BYTES = 512 * 1024


def _corpus(path: Path, rows: int) -> Path:
    rng = random.Random(7)
    with open(path, "w") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))}) + "\n")
    return path


def _recipe(tmp_path: Path, corpus: Path, cache: Path) -> Path:
    path = tmp_path / "stream.yaml"
    path.write_text(f"""\
stage: pretrain
model: {{name_or_path: "tiny:llama"}}
hardware: {{gpus_per_node: 0}}
data:
  datasets: [{{path: {corpus}, format: text}}]
  sequence_len: 128
  packing: true
  streaming: true
  stream_window: 64
  stream_log: true
  cache_dir: {cache}
train: {{max_steps: 12, global_batch_size: 8, micro_batch_size: 4, learning_rate: 3.0e-3, logging_steps: 1, seed: 5}}
output: {{dir: {tmp_path / 'run'}, save_steps: 5}}
logging: {{progress_bar: false}}
""")
    return path


def _mount_tmpfs(where: Path) -> list[str] | None:
    """A `TMPFS_BYTES` tmpfs at `where`: mounted here as root, else the command prefix that runs a command
    in a mount namespace of its own with it; None where neither is allowed."""
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(where)]
    if os.geteuid() == 0 and shutil.which("mount") and subprocess.run(mount, capture_output=True).returncode == 0:
        return []
    if shutil.which("unshare"):
        prefix = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", " ".join(mount) + ' && exec "$@"', "-"]
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "small-disk"
    prefix = _mount_tmpfs(where)
    if prefix is None:
        pytest.skip("no tmpfs can be mounted here (neither as root nor in a user namespace)")
    yield SimpleNamespace(path=where, prefix=prefix)
    if prefix == []:
        subprocess.run(["umount", str(where)], capture_output=True)


def _train(recipe: Path, small_disk, tmp_path: Path, *extra: str, fault: str | None = None):
    env = {**os.environ, "RECIPEFORGE_CACHE": str(small_disk.path / "recipeforge"),
           "HF_DATASETS_CACHE": str(small_disk.path / "hf"), "HF_HOME": str(small_disk.path / "hf-home")}
    env.pop("RECIPEFORGE_FAULT", None)
    if fault:
        env["RECIPEFORGE_FAULT"] = fault
    # The disk check runs inside the same mount namespace as the training.
    check = (f"import os,sys; st=os.statvfs({str(small_disk.path)!r}); "
             f"print('FREE', st.f_bavail*st.f_frsize, 'SIZE', st.f_blocks*st.f_frsize, file=sys.stderr)")
    command = (f"{sys.executable} -c \"{check}\" && {sys.executable} -m recipeforge train {recipe} "
               "--nproc-per-node 2 " + " ".join(extra))
    return subprocess.run([*small_disk.prefix, "sh", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def _trained_rows(run: Path, rank: int) -> list[tuple]:
    return [tuple(r) for line in (run / "data_order" / f"rank-{rank}.jsonl").read_text().splitlines()
            for r in json.loads(line)["rows"]]


def _stream_rows(recipe: Path, rank: int, sequences: int) -> list[tuple]:
    """The rows of the first `sequences` sequences of process `rank`'s stream, read here."""
    import itertools

    from recipeforge.components.tokenizer import build_tiny_tokenizer
    from recipeforge.config import load_recipe
    from recipeforge.stages.streamed_data import training_stream

    loaded = load_recipe(recipe)
    stream = training_stream(loaded.recipe, build_tiny_tokenizer(1024),
                             SimpleNamespace(base_dir=recipe.parent, locate=lambda p: None), rank=rank, world=2)
    return [tuple(r) for seq in itertools.islice(iter(stream), sequences) for r in seq["_rows"]]


@pytest.mark.slow
def test_a_corpus_larger_than_the_cache_disk_streams_and_resumes_without_losing_or_repeating_a_row(tmp_path,
                                                                                                    small_disk):
    corpus = _corpus(tmp_path / "corpus.jsonl", 6000)
    assert corpus.stat().st_size > 2 * TMPFS_BYTES
    recipe = _recipe(tmp_path, corpus, small_disk.path / "tokenized")
    run = tmp_path / "run"

    killed = _train(recipe, small_disk, tmp_path, fault="kill:1:8")  # rank 1 dies after step 8
    assert killed.returncode != 0
    assert f"SIZE {TMPFS_BYTES}" in killed.stderr, killed.stderr[-2000:]  # it ran on the small disk
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("checkpoint-")) == \
        ["checkpoint-5"]

    def train_records(first: int, last: int) -> list[dict]:
        return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                if r.get("split") == "train" and first <= r["step"] <= last]

    before_checkpoint = train_records(1, 5)
    resumed = _train(recipe, small_disk, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    assert (run / "final" / "model.safetensors").is_file()
    assert sorted(p.name for p in (run / "checkpoints" / "checkpoint-10" / "stream").iterdir()) == \
        ["rank-0.json", "rank-1.json"]

    assert train_records(1, 5) == before_checkpoint  # resumed from checkpoint-5: steps 1-5 not trained again
    assert [r["step"] for r in train_records(6, 12)] == list(range(6, 13))
    # 12 steps x one micro batch of 4 packed sequences per process: exactly the first 48 sequences of each
    # process's stream, in order: none twice (steps 6-8 were trained before the kill and again after it,
    # and only once in the record), none skipped.
    per_rank = [_trained_rows(run, rank) for rank in (0, 1)]
    for rank, rows in enumerate(per_rank):
        assert rows == _stream_rows(recipe, rank, 12 * 4)
    assert not set(per_rank[0]) & set(per_rank[1])  # each process its own rows

    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if r.get("split") == "train" and "loss" in r]
    assert losses[-1] < losses[0] - 1.0, losses
