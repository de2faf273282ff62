"""Data formats: the formats registry, rendering rows, and the SFT label masks they lead to."""

from __future__ import annotations

import pytest

from recipeforge.components.formats import (RenderOptions, formats, get_format, normalize_messages)
from recipeforge.components.lm_data import NO_TARGET, OK, TOO_LONG, TRUNCATED, tokenize_batch
from recipeforge.components.packing import IGNORE
from recipeforge.components.tokenizer import build_tiny_tokenizer
from recipeforge.errors import RecipeError


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


def _tokenize(tok, rows, *, fmt, stage_sft=True, train_on_inputs=False, sequence_len=512, truncation="truncate"):
    batch = {k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}}
    batch["_format"] = [fmt] * len(rows)
    batch["_row"] = list(range(1, len(rows) + 1))
    return tokenize_batch(batch, tokenizer=tok, train_on_inputs=train_on_inputs, sequence_len=sequence_len,
                          truncation=truncation, mask_inputs=stage_sft)


def _trained_text(tok, ids, labels):
    return tok.decode([i for i, lab in zip(ids, labels) if lab != IGNORE])


def test_the_six_formats_are_registered():
    assert {"text", "alpaca", "messages", "completion", "preference", "prompt"} <= set(formats.names())


def test_unknown_format_lists_the_available_ones():
    with pytest.raises(RecipeError) as info:
        get_format("alpacca")
    assert "unknown format 'alpacca'" in str(info.value) and "alpaca" in info.value.problems[0].hint


def test_completion_masks_the_prompt(tok):
    out = _tokenize(tok, [{"prompt": "Q: cow?", "completion": " moo"}], fmt="completion")
    ids, labels = out["input_ids"][0], out["labels"][0]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert _trained_text(tok, ids, labels) == " moo" + tok.eos_token
    assert out["status"] == [OK]


def test_alpaca_through_the_chat_template(tok):
    out = _tokenize(tok, [{"instruction": "What does the cow say?", "input": "Be brief.", "output": "moo"}],
                    fmt="alpaca")
    ids, labels = out["input_ids"][0], out["labels"][0]
    full = tok.decode(ids)
    assert "<|im_start|>user\nWhat does the cow say?\n\nBe brief.<|im_end|>" in full
    assert _trained_text(tok, ids, labels) == "moo<|im_end|>"  # the newline after the turn end is not trained


def test_multi_turn_messages_train_every_assistant_turn(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "cow?"},
            {"role": "assistant", "content": "moo"}, {"role": "user", "content": "dog?"},
            {"role": "assistant", "content": "woof"}]
    out = _tokenize(tok, [{"messages": msgs}], fmt="messages")
    assert _trained_text(tok, out["input_ids"][0], out["labels"][0]) == "moo<|im_end|>woof<|im_end|>"
    everything = _tokenize(tok, [{"messages": msgs}], fmt="messages", train_on_inputs=True)
    assert all(lab != IGNORE for lab in everything["labels"][0])


def test_sharegpt_rows_are_normalized():
    msgs = normalize_messages([{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}])
    assert msgs == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(RecipeError, match="row 3: message role 'robot'"):
        normalize_messages([{"role": "robot", "content": "x"}], row=3)


def test_pretraining_text_trains_everything(tok):
    out = _tokenize(tok, [{"text": "The cow says moo."}], fmt="text", stage_sft=False)
    assert out["labels"][0] == out["input_ids"][0]


def test_truncate_drop_and_nothing_to_learn(tok):
    long = {"prompt": "word " * 50, "completion": " moo"}
    cut = _tokenize(tok, [long], fmt="completion", sequence_len=20)
    assert cut["status"] == [NO_TARGET] and cut["input_ids"] == [[]]  # the answer was cut off
    ok = _tokenize(tok, [{"prompt": "Q:", "completion": " one two three four five six seven"}], fmt="completion",
                   sequence_len=6)
    assert ok["status"] == [TRUNCATED] and len(ok["input_ids"][0]) == 6
    dropped = _tokenize(tok, [long], fmt="completion", sequence_len=20, truncation="drop")
    assert dropped["status"] == [TOO_LONG]


def test_empty_required_value_names_the_row(tok):
    with pytest.raises(RecipeError, match="row 2: column 'completion' is empty"):
        _tokenize(tok, [{"prompt": "a", "completion": "b"}, {"prompt": "a", "completion": ""}], fmt="completion")


def test_preference_and_prompt_rows(tok):
    opts = RenderOptions(tok)
    pref = get_format("preference").render({"prompt": "cow?", "chosen": "moo", "rejected": "quack"}, opts)
    assert pref == {"prompt": "cow?", "chosen": "moo", "rejected": "quack"}
    conv = get_format("preference").render(
        {"prompt": [{"role": "user", "content": "cow?"}], "chosen": "moo", "rejected": "quack"}, opts)
    assert conv["chosen"] == [{"role": "assistant", "content": "moo"}]
    # an answer given as one message; answers holding the whole exchange beside the prompt (argilla's layout):
    # their replies, so that the prompt is not sent twice
    one = get_format("preference").render({"prompt": [{"role": "user", "content": "cow?"}], "rejected": "quack",
                                           "chosen": {"role": "assistant", "content": "moo"}}, opts)
    assert one["chosen"] == [{"role": "assistant", "content": "moo"}]

    def whole(reply):
        return [{"role": "user", "content": "cow?"}, {"role": "assistant", "content": reply}]

    row = {"prompt": "cow?", "chosen": whole("moo"), "rejected": whole("quack")}
    assert get_format("preference").render(row, opts) == {"prompt": [{"role": "user", "content": "cow?"}],
                                                          "chosen": [{"role": "assistant", "content": "moo"}],
                                                          "rejected": [{"role": "assistant", "content": "quack"}]}
    with pytest.raises(RecipeError, match="column 'chosen' holds turns before its reply that are not the prompt's"):
        get_format("preference").render({**row, "prompt": "dog?"}, opts)
    unpaired = get_format("unpaired").render({"prompt": "cow?", "completion": whole("moo"), "label": True}, opts)
    assert unpaired["completion"] == [{"role": "assistant", "content": "moo"}]
    prompt = get_format("prompt").render({"prompt": "cow?", "answer": "moo"}, opts)
    assert prompt == {"prompt": "cow?", "answer": "moo"}  # extra columns kept for the rewards


def test_long_pretraining_documents_become_several_samples(tok):
    from recipeforge.components.lm_data import SPLIT

    text = " ".join(["one two three four five"] * 20)
    whole = _tokenize(tok, [{"text": text}], fmt="text", stage_sft=False)["input_ids"][0]
    out = tokenize_batch({"text": [text], "_format": ["text"], "_row": [1]}, tokenizer=tok, train_on_inputs=False,
                         sequence_len=16, truncation="truncate", mask_inputs=False, split_long=True)
    assert set(out["status"]) == {SPLIT} and all(len(x) <= 16 for x in out["input_ids"])
    assert [t for piece in out["input_ids"] for t in piece] == whole[: sum(len(p) for p in out["input_ids"])]
    assert len(whole) - sum(len(p) for p in out["input_ids"]) <= 1  # at most a 1-token tail is left out
