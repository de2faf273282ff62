"""The chat-template library: every named template renders its family's layout and trains exactly the replies."""

from __future__ import annotations

import pytest

from recipeforge.components.chat_templates import ALIASES, TEMPLATES, resolve
from recipeforge.components.formats import RenderOptions, chat_segments
from recipeforge.components.lm_data import tokenize_batch
from recipeforge.components.packing import IGNORE
from recipeforge.components.tokenizer import build_tiny_tokenizer, set_chat_template
from recipeforge.errors import Location, RecipeError

REPLIES = ["The cow says moo.", "Woof, says the dog: one two three!"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does the cow say?"},
        {"role": "assistant", "content": REPLIES[0]}, {"role": "user", "content": "And the dog?"},
        {"role": "assistant", "content": REPLIES[1]}]
# The start of each template's layout, as its model family's official template writes it.
LAYOUT = {
    "chatml": "<|bos|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n",
    "llama3": "<|bos|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user",
    "llama4": "<|bos|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|><|header_start|>user<|header_end|>",
    "qwen2.5": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat",
    "qwen3": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat",
    "gemma3": "<|bos|><start_of_turn>user\nBe brief.\n\nWhat does the cow say?<end_of_turn>\n<start_of_turn>model\n",
    "mistral_v3": "<|bos|>[INST] What does the cow say?[/INST] The cow says moo.<|im_end|>[INST] Be brief.\n\nAnd",
    "mistral_v3_tekken": "<|bos|>[INST]What does the cow say?[/INST]The cow says moo.<|im_end|>[INST]Be brief.",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nWhat does the cow say?<|end|>\n<|assistant|>\n",
    "deepseek_v3": "<|bos|>Be brief.<｜User｜>What does the cow say?<｜Assistant｜>The cow says moo."
                   "<｜end▁of▁sentence｜>",
    "zephyr": "<|system|>\nBe brief.<|im_end|>\n<|user|>\n",
}


def _template_tokenizer(name):
    tok = build_tiny_tokenizer(1024)
    added = set_chat_template(tok, name, required=True)
    return tok, added


def _labelled(tok, messages, **opts):
    segs = chat_segments(messages, RenderOptions(tok, eos_token=tok.eos_token, **opts))
    def ids_of(piece):
        return piece if isinstance(piece, list) else tok.encode(piece, add_special_tokens=False)

    ids = [t for piece, _ in segs for t in ids_of(piece)]
    trained = [t for piece, on in segs if on for t in ids_of(piece)]
    return ids, trained


def test_every_brief_template_is_in_the_library():
    assert set(LAYOUT) == set(TEMPLATES)
    assert {ALIASES[a] for a in ("qwen_25", "phi_3", "deepseekv3", "mistral_v2v3")} <= set(TEMPLATES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_round_trip_trains_exactly_the_replies(name):
    tok, added = _template_tokenizer(name)
    info = TEMPLATES[name]
    for t in (*info.special, *info.plain):  # each of the template's tokens is one token of the vocabulary
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    plain_vocab = build_tiny_tokenizer(1024).get_vocab()
    assert len(added) == len([t for t in (*info.special, *info.plain) if t not in plain_vocab])
    ids, trained = _labelled(tok, CHAT)
    assert tok.decode(ids).startswith(LAYOUT[name])
    eot = info.eot or tok.eos_token
    lead = " " if name == "mistral_v3" else ""  # Mistral v3 writes a space before a reply, which the model generates
    assert tok.decode(trained) == "".join(lead + r + eot for r in REPLIES)
    # Through the tokenization pipeline: labels are the ids where trained, -100 elsewhere.
    out = tokenize_batch({"messages": [CHAT], "_format": ["messages"], "_row": [1]}, tokenizer=tok,
                         train_on_inputs=False, sequence_len=512, truncation="truncate", mask_inputs=True)
    labels = out["labels"][0]
    assert tok.decode([t for t in labels if t != IGNORE]) == tok.decode(trained)
    assert out["input_ids"][0] == ids


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_train_flags_and_train_on_inputs(name):
    tok, _ = _template_tokenizer(name)
    flagged = [dict(m) for m in CHAT]
    flagged[2]["train"] = False
    _, trained = _labelled(tok, flagged)
    eot = TEMPLATES[name].eot or tok.eos_token
    assert tok.decode(trained).strip() == REPLIES[1] + eot  # the first reply is context only
    ids, everything = _labelled(tok, CHAT, train_on_inputs=True)
    assert everything == ids


def test_qwen3_keeps_the_reasoning_of_the_last_reply_only():
    tok, _ = _template_tokenizer("qwen3")
    chat = [{"role": "user", "content": "cow?"}, {"role": "assistant", "content": "<think>\nanimal\n</think>\n\nmoo"},
            {"role": "user", "content": "dog?"}, {"role": "assistant", "content": "<think>\nalso\n</think>\n\nwoof"}]
    ids, trained = _labelled(tok, chat)
    text = tok.decode(ids)
    assert "animal" not in text and "<|im_start|>assistant\nmoo<|im_end|>" in text  # earlier reasoning dropped
    assert tok.decode(trained) == "moo<|im_end|><think>\nalso\n</think>\n\nwoof<|im_end|>"


def test_a_user_message_cannot_be_marked_trained():
    tok, _ = _template_tokenizer("chatml")
    chat = [dict(CHAT[1], train=True), CHAT[2]]
    with pytest.raises(RecipeError, match=r"message 1 \(user\) is marked to be trained"):
        _labelled(tok, chat)


def test_a_template_without_generation_blocks_trains_up_to_the_turn_end():
    tok = build_tiny_tokenizer(1024)
    tok.chat_template = ("{% for m in messages %}"
                         "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    _, trained = _labelled(tok, CHAT[1:])
    assert tok.decode(trained) == "".join(r + "<|im_end|>" for r in REPLIES)  # not the newline after it
    flagged = [dict(m) for m in CHAT[1:]]
    flagged[1]["train"] = False
    assert tok.decode(_labelled(tok, flagged)[1]) == REPLIES[1] + "<|im_end|>"


def test_gemma3_refuses_roles_out_of_turn():
    tok, _ = _template_tokenizer("gemma3")
    with pytest.raises(RecipeError, match="cannot render this conversation: Conversation roles must alternate"):
        _labelled(tok, [CHAT[1], CHAT[3]])


def test_names_aliases_and_files(tmp_path):
    assert resolve("tokenizer") is None
    assert resolve("qwen_25").name == "qwen2.5" and resolve("llama3").eot == "<|eot_id|>"
    with pytest.raises(RecipeError) as info:
        resolve("lama3", location=Location("r.yaml", 4, 18))
    problem = info.value.problems[0]
    assert "unknown chat template 'lama3'" in problem.message and "did you mean 'llama3'" in problem.hint
    assert problem.key == "data.chat_template" and problem.location.line == 4
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "mine.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    recipe_at = Location(str(tmp_path / "recipe.yaml"), 3, 2)
    found = resolve("tpl/mine.jinja", location=recipe_at)  # relative to the file that sets it
    assert found.name == str(tmp_path / "tpl" / "mine.jinja") and "for m in messages" in found.text
    with pytest.raises(RecipeError, match="chat template file 'tpl/other.jinja' not found") as info:
        resolve("tpl/other.jinja", location=recipe_at)
    assert str(tmp_path / "tpl" / "other.jinja") in info.value.problems[0].message


def test_the_recipe_check_accepts_names_aliases_and_paths(tmp_path):
    from recipeforge.config import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage: sft\nmodel: {name_or_path: 'tiny:llama'}\n"
                      "data: {datasets: [{path: d.jsonl, format: messages}], chat_template: qwen_25}\n"
                      "train: {max_steps: 1}\n")
    assert load_recipe(recipe).recipe.data.chat_template == "qwen_25"
    assert load_recipe(recipe, overrides=["data.chat_template=my/t.jinja"]).recipe.data.chat_template == "my/t.jinja"
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe, overrides=["data.chat_template=gema3"])
    assert "did you mean 'gemma3'" in info.value.problems[0].hint
