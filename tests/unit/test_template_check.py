"""The train-vs-serve chat template check: every shipped template gives the same tokens before each reply
when trained and when served from the saved tokenizer; a template that differs is named at its token."""

from __future__ import annotations

import copy

import pytest

from recipeforge.components.chat_templates import TEMPLATES
from recipeforge.components.template_check import (
    IGNORE, TOOL_PROBE, first_mismatch, probes_for, reply_starts, saved_tokenizer, serve_prompt_ids, train_encoding,
)
from recipeforge.components.tokenizer import add_tokens, build_tiny_tokenizer


def _tokenizer(name: str):
    info = TEMPLATES[name]
    tok = build_tiny_tokenizer(1024)
    tok.chat_template = info.text
    add_tokens(tok, special=info.special, plain=info.plain)
    return tok, ((info.eot,) if info.eot else ())


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_shipped_template_serves_what_it_trains(name, tmp_path):
    tok, eots = _tokenizer(name)
    served = saved_tokenizer(tok, tmp_path)
    assert first_mismatch(tok, served, eot_tokens=eots) is None
    # The comparison is not vacuous: each probe reply is a trained span, after a non-empty served prompt.
    for messages in probes_for(tok):
        ids, labels = train_encoding(tok, messages, eot_tokens=eots)
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        starts = reply_starts(labels)
        assert len(starts) == len(replies)
        assert all(starts[r] > 0 and labels[starts[r] - 1] == IGNORE for r in range(len(replies)))


def test_a_generation_prompt_that_differs_is_named_at_its_token():
    tok, eots = _tokenizer("chatml")
    served = copy.deepcopy(tok)
    # The server's template opens the reply with a space after the role instead of a newline.
    served.chat_template = TEMPLATES["chatml"].text.replace(
        "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}",
        "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant ' }}")
    assert served.chat_template != tok.chat_template
    found = first_mismatch(tok, served, eot_tokens=eots)
    assert found is not None and found.conversation == 0 and found.reply == 0
    prompt = serve_prompt_ids(served, probes_for(tok)[0][:2])
    ids, _ = train_encoding(tok, probes_for(tok)[0], eot_tokens=eots)
    # The first differing position is where the two token lists part.
    assert ids[:found.position] == prompt[:found.position] and ids[found.position] != prompt[found.position]
    assert found.train_token == tok.convert_ids_to_tokens(ids[found.position])
    assert found.serve_token == served.convert_ids_to_tokens(prompt[found.position])
    assert "assistant" in found.context and repr(found.train_token) in found.describe()


def test_another_family_on_the_server_is_a_mismatch():
    tok, eots = _tokenizer("chatml")
    served = copy.deepcopy(tok)
    served.chat_template = TEMPLATES["qwen2.5"].text  # writes a default system prompt, no BOS
    found = first_mismatch(tok, served, eot_tokens=eots)
    assert found is not None and found.position == 0
    assert (found.train_token, found.serve_token) == ("<|bos|>", "<|im_start|>")


def test_a_tool_call_is_probed_when_the_template_renders_tools():
    tok, _ = _tokenizer("chatml")
    assert TOOL_PROBE not in probes_for(tok)  # the shipped ChatML writes no tool calls
    tool_template = TEMPLATES["chatml"].text.replace(
        "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}",
        "{%- generation %}{{- message['content'] }}{%- for call in message.get('tool_calls', []) %}"
        "{{- '<tool_call>' + call['function']['name'] + ' ' + call['function']['arguments']['expression'] "
        "+ '</tool_call>' }}{%- endfor %}{{- '<|im_end|>' }}{%- endgeneration %}")
    tok.chat_template = tool_template
    assert TOOL_PROBE in probes_for(tok)
    served = copy.deepcopy(tok)
    assert first_mismatch(tok, served) is None
    served.chat_template = tool_template.replace("'<|im_start|>' + message['role']", "'<|im_start|>' + 'user'")
    found = first_mismatch(tok, served, [TOOL_PROBE])
    assert found is not None and found.reply == 1  # the tool result is rendered as a user turn by the server
