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


def test_trained_once_per_machine(tmp_path, monkeypatch):
    """The trained tokenizer is kept under the cache root and read back the same; a damaged file is
    trained again and replaced."""
    from recipeforge.components import tokenizer as tk

    monkeypatch.setenv("RECIPEFORGE_CACHE", str(tmp_path))
    fresh = tk._train_tiny_tokenizer(1024)
    tk._tiny_tokenizer_json.cache_clear()
    try:
        assert tk._tiny_tokenizer_json(1024) == fresh  # trained and written
        kept = tk._tiny_cache_path(1024)
        assert kept.parent == tmp_path / "tiny-tokenizer" and kept.read_text() == fresh
        kept.write_text(fresh + "\n")  # the same tokenizer, told apart from a freshly trained one
        tk._tiny_tokenizer_json.cache_clear()
        assert tk._tiny_tokenizer_json(1024) == fresh + "\n"  # read back, not trained
        kept.write_text(fresh[: len(fresh) // 2])
        tk._tiny_tokenizer_json.cache_clear()
        assert tk._tiny_tokenizer_json(1024) == fresh and kept.read_text() == fresh  # damaged: trained again
        assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no temporary files left
    finally:
        tk._tiny_tokenizer_json.cache_clear()


def test_cache_key_follows_the_training(monkeypatch):
    from recipeforge.components import tokenizer as tk

    key = tk._tiny_cache_path(1024)
    assert tk._tiny_cache_path(512) != key
    monkeypatch.setattr(tk, "_WORDS", tk._WORDS + " zebra")
    assert tk._tiny_cache_path(1024) != key
    monkeypatch.undo()

    def _corpus(rows: int = 4001, seed: int = 0) -> list[str]:  # another corpus generator
        return []

    monkeypatch.setattr(tk, "_corpus", _corpus)
    assert tk._tiny_cache_path(1024) != key


def test_unwritable_cache_still_builds(tmp_path, monkeypatch):
    from recipeforge.components import tokenizer as tk

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RECIPEFORGE_CACHE", str(blocker))  # a file where the folder should be
    tk._tiny_tokenizer_json.cache_clear()
    try:
        assert len(build_tiny_tokenizer(1024)) == 1024
    finally:
        tk._tiny_tokenizer_json.cache_clear()
