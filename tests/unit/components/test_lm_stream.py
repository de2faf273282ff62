"""Streamed causal-LM data (`data.streaming`): the cached path's tokens and masks, every row once per pass,
each process its own rows, and a saved position that continues exactly where it stopped."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipeforge.components.lm_data import prepare_lm_data
from recipeforge.components.packing import IGNORE
from recipeforge.components.tokenizer import build_tiny_tokenizer, set_chat_template
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError
from recipeforge.stages.streamed_data import training_stream

DATA = Path(__file__).resolve().parents[3] / "examples" / "data"
WORDS = "the cow dog cat says moo woof meow one two three red blue green apple".split()


def _recipe(tmp_path, stage: str, datasets: list[tuple[str, str]], **data) -> object:
    body = {"datasets": [{"path": str(p), "format": f} for p, f in datasets], "sequence_len": 64,
            "cache_dir": str(tmp_path / "cache"), **data}
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps({"stage": stage, "model": {"name_or_path": "tiny:llama"}, "data": body,
                                "train": {"max_steps": 10, "seed": 3}}))
    return load_recipe(path).recipe


def _tokenizer(chat: bool):
    tok = build_tiny_tokenizer(1024)
    if chat:
        set_chat_template(tok, "chatml", required=True)
    return tok


def _stream(recipe, tok, tmp_path, *, rank=0, world=1):
    return training_stream(recipe, tok, SimpleNamespace(base_dir=tmp_path, locate=lambda path: None), rank=rank,
                           world=world)


def _rows(ds) -> list[tuple]:
    cols = ["input_ids", "labels"] + (["position_ids"] if "position_ids" in ds.column_names else [])
    return [tuple(tuple(ds[i][c]) for c in cols) for i in range(len(ds))]


def _streamed(items) -> list[tuple]:
    return [tuple(tuple(s[c]) for c in ("input_ids", "labels", "position_ids") if c in s) for s in items]


def _documents(tmp_path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 90)))})
                            + "\n" for _ in range(n)))
    return path


@pytest.mark.parametrize("stage,data,fmt,packing", [
    ("pretrain", "pretrain.jsonl", "text", True),
    ("sft", "sft-alpaca.jsonl", "alpaca", True),
    ("sft", "sft-chat.jsonl", "messages", False),
])
def test_a_corpus_within_one_window_gives_the_cached_paths_sequences(tmp_path, stage, data, fmt, packing):
    recipe = _recipe(tmp_path, stage, [(DATA / data, fmt)], packing=packing, streaming=True, shuffle=False,
                     stream_window=100_000)
    tok = _tokenizer(fmt != "text")
    cached = prepare_lm_data(recipe, tok, base_dir=tmp_path, use_cache=False)
    stream = _stream(recipe, tok, tmp_path)
    per_pass = len(cached.train)
    got = _streamed(itertools.islice(iter(stream), per_pass))
    assert got == _rows(cached.train)
    assert any(IGNORE in labels for _, labels, *rest in got) or stage == "pretrain"


def test_small_windows_train_every_sample_once_per_pass(tmp_path):
    docs = _documents(tmp_path, 700)
    recipe = _recipe(tmp_path, "pretrain", [(docs, "text")], packing=True, streaming=True, stream_window=64)
    tok = _tokenizer(False)
    cached = prepare_lm_data(recipe.model_copy(update={"data": recipe.data.model_copy(update={"packing": False})}),
                             tok, base_dir=tmp_path, use_cache=False)
    expected = Counter(tuple(ids) for ids in cached.train["input_ids"])
    stream = _stream(recipe, tok, tmp_path)
    samples: Counter = Counter()
    for seq in iter(stream):
        if stream.position.passes > 0:
            break
        starts = [i for i, p in enumerate(seq["position_ids"]) if p == 0] + [len(seq["input_ids"])]
        for a, b in zip(starts, starts[1:]):
            samples[tuple(seq["input_ids"][a:b])] += 1
        assert len(seq["input_ids"]) <= 64
    assert samples == expected


def test_each_process_reads_its_own_rows(tmp_path):
    docs = _documents(tmp_path, 300)
    recipe = _recipe(tmp_path, "pretrain", [(docs, "text")], packing=True, streaming=True, stream_window=50)
    tok = _tokenizer(False)
    seen = []
    for rank in (0, 1):
        stream = _stream(recipe, tok, tmp_path, rank=rank, world=2)
        rows = set()
        for seq in iter(stream):
            if stream.position.passes > 0:
                break
            rows.update(tuple(r) for r in seq["_rows"])
        seen.append(rows)
    assert not seen[0] & seen[1]
    assert {r for _, r in seen[0] | seen[1]} == set(range(1, 301))


@pytest.mark.parametrize("stop_after", [1, 37, 80, 150])  # inside a window, at its end, in the next pass
def test_a_saved_position_continues_where_it_stopped(tmp_path, stop_after):
    docs = _documents(tmp_path, 200)
    recipe = _recipe(tmp_path, "pretrain", [(docs, "text")], packing=True, streaming=True, stream_window=40)
    tok = _tokenizer(False)
    straight = _streamed(itertools.islice(iter(_stream(recipe, tok, tmp_path)), stop_after + 60))
    first = _stream(recipe, tok, tmp_path)
    head = _streamed(itertools.islice(iter(first), stop_after))
    first.save(tmp_path / "ckpt", 0)
    again = _stream(recipe, tok, tmp_path)
    again.restore(tmp_path / "ckpt", 0, 1)
    tail = _streamed(itertools.islice(iter(again), 60))
    assert head + tail == straight


def test_a_checkpoint_of_another_world_size_is_refused(tmp_path):
    docs = _documents(tmp_path, 50)
    recipe = _recipe(tmp_path, "pretrain", [(docs, "text")], packing=True, streaming=True)
    tok = _tokenizer(False)
    stream = _stream(recipe, tok, tmp_path)
    next(iter(stream))
    stream.save(tmp_path / "ckpt", 0)
    with pytest.raises(RecipeError, match="stream positions of 1 processes, and this run has 2"):
        _stream(recipe, tok, tmp_path, rank=0, world=2).restore(tmp_path / "ckpt", 0, 2)
    with pytest.raises(RecipeError, match="no stream position"):
        stream.restore(tmp_path / "elsewhere", 0, 1)


def test_shards_named_by_a_glob_stream_in_order(tmp_path):
    rows = [{"text": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(5))} for i in range(30)]
    shards = tmp_path / "shards"
    shards.mkdir()
    for s in range(3):
        (shards / f"part-{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[s * 10:(s + 1) * 10]))
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = _tokenizer(False)
    whole = _stream(_recipe(tmp_path, "pretrain", [(tmp_path / "all.jsonl", "text")], packing=False, shuffle=False,
                            streaming=True), tok, tmp_path)
    globbed = _stream(_recipe(tmp_path, "pretrain", [("shards/part-*.jsonl", "text")], packing=False, shuffle=False,
                              streaming=True), tok, tmp_path)
    assert _streamed(itertools.islice(iter(globbed), 30)) == _streamed(itertools.islice(iter(whole), 30))


def test_a_missing_column_is_said_before_training(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text column"}\n')
    recipe = _recipe(tmp_path, "pretrain", [(bad, "text")], streaming=True)
    with pytest.raises(RecipeError, match="format 'text' needs column 'text'.*columns found: body"):
        _stream(recipe, _tokenizer(False), tmp_path)


def test_a_bad_row_further_on_stops_the_stream_with_its_row_number(tmp_path):
    rows = [{"text": "the cow says moo"}] * 90 + [{"text": None}] + [{"text": "one two"}] * 9
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = _recipe(tmp_path, "pretrain", [(path, "text")], streaming=True, stream_window=32)
    stream = _stream(recipe, _tokenizer(False), tmp_path)
    with pytest.raises(RecipeError, match="row 91"):
        for _ in iter(stream):
            pass
