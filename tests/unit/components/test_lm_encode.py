"""Fast LM tokenization (`lm_encode`, `packing.pack_flat`): the same ids, labels and packing as the
row-by-row reference (`lm_data.tokenize_batch`, `packing.pack`) on representative rows of every LM format (in worker
processes: tests/commands/test_lm_encode.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from recipeforge.components.formats import get_format
from recipeforge.components.lm_data import tokenize_batch
from recipeforge.components.lm_encode import (KEPT, EncodeOptions, encode_dataset, encode_rows, resolve_processes,
                                              to_arrow)
from recipeforge.components.packing import pack, pack_flat
from recipeforge.components.tokenizer import build_tiny_tokenizer, set_chat_template
from recipeforge.errors import RecipeError

WORDS = "the cow says moo dog woof what does one two three apple red blue é ü 日本 🙂 \n".split(" ")


def _text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _rows(fmt: str, n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        if fmt == "alpaca":
            rows.append({"instruction": _text(rng, 1, 12), "input": _text(rng, 0, 8) if rng.random() < .5 else "",
                         "output": _text(rng, 1, 60)})
        elif fmt == "messages":
            turns = []
            if rng.random() < .3:
                turns.append({"role": "system", "content": _text(rng, 1, 5)})
            for _ in range(rng.randint(1, 3)):
                turns += [{"role": "user", "content": _text(rng, 1, 10)},
                          {"role": "assistant", "content": _text(rng, 0, 30), "train": rng.random() < .8}]
            rows.append({"messages": turns})
        elif fmt == "completion":
            rows.append({"prompt": _text(rng, 1, 20), "completion": _text(rng, 1, 40)})
        else:
            rows.append({"text": _text(rng, 1, 150)})
    return rows


def _columns(rows, fmt):
    cols = {k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}}
    cols["_format"] = [fmt] * len(rows)
    cols["_row"] = list(range(1, len(rows) + 1))
    return cols


def _reference(tok, rows, fmt, **kw):
    out = tokenize_batch(_columns(rows, fmt), tokenizer=tok, **kw)
    keep = [i for i, s in enumerate(out["status"]) if s in KEPT]
    return [out["input_ids"][i] for i in keep], [out["labels"][i] for i in keep], out["status"]


def _fast(tok, rows, fmt, *, train_on_inputs, sequence_len, truncation, mask_inputs, split_long=False):
    options = EncodeOptions(train_on_inputs=train_on_inputs or not mask_inputs, sequence_len=sequence_len,
                            truncation=truncation, split_long=split_long)
    enc = encode_rows(_columns(rows, fmt), get_format(fmt), tok, options)
    table = to_arrow({"input_ids": enc.ids, "labels": enc.labels}, enc.lengths)
    return table.column("input_ids").to_pylist(), table.column("labels").to_pylist(), enc.status.tolist()


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


@pytest.fixture(scope="module")
def llama3():
    t = build_tiny_tokenizer(1024)
    set_chat_template(t, "llama3", required=True)
    return t


CASES = [  # (format, options): masks, truncation, dropping and splitting all reached
    ("alpaca", dict(train_on_inputs=False, sequence_len=48, truncation="truncate", mask_inputs=True)),
    ("alpaca", dict(train_on_inputs=True, sequence_len=512, truncation="drop", mask_inputs=True)),
    ("messages", dict(train_on_inputs=False, sequence_len=64, truncation="drop", mask_inputs=True)),
    ("messages", dict(train_on_inputs=False, sequence_len=30, truncation="truncate", mask_inputs=True)),
    ("completion", dict(train_on_inputs=False, sequence_len=40, truncation="truncate", mask_inputs=True)),
    ("text", dict(train_on_inputs=False, sequence_len=64, truncation="truncate", mask_inputs=False,
                  split_long=True)),
    ("text", dict(train_on_inputs=False, sequence_len=64, truncation="truncate", mask_inputs=True)),
]


@pytest.mark.parametrize("fmt,kw", CASES)
@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_fast_path_matches_the_row_by_row_reference(tok, llama3, fmt, kw, template):
    t = tok if template == "chatml" else llama3
    rows = _rows(fmt, 120, seed=len(fmt))
    ids, labels, status = _fast(t, rows, fmt, **kw)
    ref_ids, ref_labels, ref_status = _reference(t, rows, fmt, **kw)
    assert status == ref_status
    assert ids == ref_ids
    assert labels == ref_labels
    assert any(lab != -100 for row in labels for lab in row)


def test_statuses_cover_truncation_dropping_and_splitting(tok):
    _, _, truncated = _fast(tok, _rows("alpaca", 60), "alpaca", train_on_inputs=False, sequence_len=48,
                            truncation="truncate", mask_inputs=True)
    _, _, dropped = _fast(tok, _rows("messages", 60), "messages", train_on_inputs=False, sequence_len=64,
                          truncation="drop", mask_inputs=True)
    _, _, split = _fast(tok, _rows("text", 60), "text", train_on_inputs=False, sequence_len=64,
                        truncation="truncate", mask_inputs=False, split_long=True)
    assert {1, 3} <= set(truncated) and 2 in dropped and 4 in split  # TRUNCATED, NO_TARGET, TOO_LONG, SPLIT


def test_token_ranges_from_offsets_match_bisection(tok):
    from recipeforge.components.chat_masks import span_token_ranges
    from recipeforge.components.lm_encode import _ranges_from_offsets

    text = "<|im_start|>user\né 日本 🙂 the cow<|im_end|>\n<|im_start|>assistant\nmoo 🙂 日本<|im_end|>\n"
    enc = tok.backend_tokenizer.encode(text, add_special_tokens=False)
    for spans in ([(0, 5)], [(14, 20), (60, 70)], [(len(text) - 12, len(text))], [(13, 14)]):
        assert span_token_ranges(enc, spans) == _ranges_from_offsets(enc.offsets, spans)


def test_pack_flat_equals_pack():
    rng = random.Random(3)
    samples = [[rng.randrange(1000) for _ in range(rng.randint(1, 90))] for _ in range(300)]
    labels = [[t if rng.random() < .7 else -100 for t in s] for s in samples]
    ref, ref_stats = pack(samples, labels, 128)
    flat, stats = pack_flat(np.array([t for s in samples for t in s], np.int32),
                            np.array([t for s in labels for t in s], np.int32), [len(s) for s in samples], 128)
    table = to_arrow({k: flat[k] for k in ("input_ids", "labels", "position_ids")}, flat["lengths"])
    assert stats == ref_stats
    for k in ("input_ids", "labels", "position_ids"):
        assert table.column(k).to_pylist() == ref[k]


def test_arrow_columns_split_at_the_int32_offset_limit(monkeypatch):
    import recipeforge.components.lm_encode as lm_encode

    monkeypatch.setattr(lm_encode, "MAX_CHUNK_VALUES", 5)
    values = np.arange(12, dtype=np.int32)
    table = to_arrow({"input_ids": values}, np.array([3, 0, 2, 5, 2]))
    assert table.column("input_ids").num_chunks == 3
    assert table.column("input_ids").to_pylist() == [[0, 1, 2], [], [3, 4], [5, 6, 7, 8, 9], [10, 11]]


@pytest.mark.parametrize("num_proc", [1])  # [2]: tests/commands/test_lm_encode.py
def test_encode_dataset_in_workers_gives_the_same_rows(tok, monkeypatch, num_proc):
    import datasets

    import recipeforge.components.lm_encode as lm_encode

    monkeypatch.setattr(lm_encode, "CHUNK_ROWS", 50)
    monkeypatch.setattr(lm_encode, "MIN_ROWS_PER_PROCESS", 10)
    rows = _rows("alpaca", 230, seed=9)
    kw = dict(train_on_inputs=False, sequence_len=48, truncation="truncate", mask_inputs=True)
    ds = datasets.Dataset.from_dict(_columns(rows, "alpaca"))
    table, status = encode_dataset(ds, get_format("alpaca"), tok, EncodeOptions(False, 48, "truncate"),
                                   num_proc=num_proc)
    ref_ids, ref_labels, ref_status = _reference(tok, rows, "alpaca", **kw)
    assert status.tolist() == ref_status
    assert table.column("input_ids").to_pylist() == ref_ids and table.column("labels").to_pylist() == ref_labels


@pytest.mark.parametrize("num_proc", [1])  # [2]: tests/commands/test_lm_encode.py
def test_a_bad_row_is_named_as_the_reference_names_it(tok, monkeypatch, num_proc):
    import datasets

    import recipeforge.components.lm_encode as lm_encode

    monkeypatch.setattr(lm_encode, "CHUNK_ROWS", 40)
    monkeypatch.setattr(lm_encode, "MIN_ROWS_PER_PROCESS", 10)
    rows = _rows("messages", 120, seed=4)
    rows[97]["messages"][0] = {"role": "robot", "content": "beep"}
    rows[101]["messages"] = []
    with pytest.raises(RecipeError) as ref:
        tokenize_batch(_columns(rows, "messages"), tokenizer=tok, train_on_inputs=False, sequence_len=64,
                       truncation="truncate", mask_inputs=True)
    ds = datasets.Dataset.from_list([{"messages": r["messages"]} for r in rows]).add_column(
        "_row", list(range(1, 121))).add_column("_format", ["messages"] * 120)
    with pytest.raises(RecipeError) as fast:
        encode_dataset(ds, get_format("messages"), tok, EncodeOptions(False, 64, "truncate"), num_proc=num_proc)
    assert str(fast.value) == str(ref.value) and "row 98" in str(fast.value)


def test_num_proc_auto_is_one_process_per_core_and_small_data_uses_fewer(monkeypatch):
    import recipeforge.components.lm_encode as lm_encode
    from recipeforge.config.schema.data import DataConfig

    monkeypatch.setattr(lm_encode, "available_cores", lambda: 2)
    data = DataConfig(datasets=[{"path": "x.jsonl", "format": "alpaca"}], num_proc="auto")
    assert data.num_proc == 2
    assert resolve_processes("auto", 20_000) == 2 and resolve_processes(4, 2_500) == 2
    assert resolve_processes(2, 999) == 1
    monkeypatch.setattr(lm_encode, "available_cores", lambda: 64)
    assert resolve_processes("auto", 10**6) == lm_encode.AUTO_MAX_PROCESSES


def test_chat_rows_are_rendered_in_one_call_with_the_row_by_row_result(tok):
    from recipeforge.components.formats import RenderOptions
    from recipeforge.components.lm_encode import _plan_chats, _plan_rows

    cols = _columns(_rows("messages", 40, seed=2), "messages")
    opts = RenderOptions(tok, eos_token=tok.eos_token)
    assert _plan_chats(cols, get_format("messages"), opts, tok.chat_template) == \
        _plan_rows(cols, get_format("messages"), opts, tok.chat_template)
