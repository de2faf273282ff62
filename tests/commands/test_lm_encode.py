"""Fast LM tokenization in worker processes (`num_proc=2`): the same rows as the row-by-row reference,
and a bad row named as the reference names it (one process: tests/unit/components/test_lm_encode.py)."""

from __future__ import annotations

import random

import pytest

from recipeforge.components.formats import get_format
from recipeforge.components.lm_data import tokenize_batch
from recipeforge.components.lm_encode import KEPT, EncodeOptions, encode_dataset
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


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


@pytest.fixture(scope="module")
def llama3():
    t = build_tiny_tokenizer(1024)
    set_chat_template(t, "llama3", required=True)
    return t


@pytest.mark.parametrize("num_proc", [2])  # [1]: tests/unit/components/test_lm_encode.py
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


@pytest.mark.parametrize("num_proc", [2])  # [1]: tests/unit/components/test_lm_encode.py
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
