"""The tiny models' locally built tokenizer and the named chat templates."""

from __future__ import annotations

import pytest

from recipeforge.components.tokenizer import (BOS, CHAT_TEMPLATES, EOS, PAD, build_tiny_tokenizer, load_tokenizer,
                                              set_chat_template, special_prefix_ids, tokenizer_fingerprint)
from recipeforge.errors import RecipeError


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


def test_size_and_special_tokens(tok):
    assert len(tok) == 1024
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (PAD, BOS, EOS)
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    assert special_prefix_ids(tok) == [tok.bos_token_id]


def test_byte_level_round_trip(tok):
    for text in ("The cow says moo.", "ünïcödé ✓ 42 + 7 = 49\n\ttabs", "What does the yak say?"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert max(ids) < 1024


def test_deterministic_across_builds(tok):
    again = build_tiny_tokenizer(1024)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    assert again("The dog says woof.")["input_ids"] == tok("The dog says woof.")["input_ids"]


def test_fresh_instances_are_independent(tok):
    other = build_tiny_tokenizer(1024)
    other.padding_side = "left"
    other.chat_template = None
    assert tok.padding_side == "right" and tok.chat_template


def test_saves_and_loads_with_auto_tokenizer(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(tok)
    assert load_tokenizer(str(tmp_path))("hi")["input_ids"] == tok("hi")["input_ids"]


def test_chatml_is_prefix_consistent(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    for k in range(1, len(msgs)):
        short = tok.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=msgs[k]["role"] == "assistant")
        assert tok.apply_chat_template(msgs, tokenize=False).startswith(short)


def test_named_templates_and_errors(tok):
    t = build_tiny_tokenizer(1024)
    set_chat_template(t, "zephyr", required=True)
    assert t.chat_template == CHAT_TEMPLATES["zephyr"]
    with pytest.raises(RecipeError, match="unknown chat template 'chatmk'") as info:
        set_chat_template(t, "chatmk", required=True)
    assert "chatml" in info.value.problems[0].hint
    t.chat_template = None
    with pytest.raises(RecipeError, match="no chat template"):
        set_chat_template(t, "tokenizer", required=True)
    set_chat_template(t, "tokenizer", required=False)  # not needed: fine


def test_fingerprint_sees_the_template(tok):
    t = build_tiny_tokenizer(1024)
    set_chat_template(t, "llama3", required=True)
    assert tokenizer_fingerprint(t) != tokenizer_fingerprint(tok)


def test_missing_tokenizer_is_a_recipe_error(tmp_path):
    with pytest.raises(RecipeError, match="cannot load a tokenizer") as info:
        load_tokenizer(str(tmp_path / "nothing-here"))
    assert info.value.problems[0].key == "model.name_or_path"
