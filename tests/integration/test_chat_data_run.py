"""A LoRA SFT run on chat data laid out its own way, through a named template, with an added token."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

ROLES = {"user": "customer", "assistant": "agent"}


def _write_data(tiny, path) -> None:
    """The tiny chat set with other keys and role names, a system column, and `<sound>` in the replies."""
    source = tiny.recipes.parent.parent / "data" / "sft-chat.jsonl"
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    with open(path, "w") as fh:
        for i, row in enumerate(rows):
            turns = [{"speaker": ROLES[m["role"]],
                      "text": m["content"].replace(" says ", " says <sound> ") if m["role"] == "assistant"
                      else m["content"], "learn": m["role"] == "assistant" or None} for m in row["messages"]]
            fh.write(json.dumps({"conversation": turns, "sys": "Answer briefly." if i % 2 else ""}) + "\n")
        fh.write(json.dumps({"conversation": turns, "sys": ""}) + "\n")  # a duplicate of the last row


@pytest.fixture(scope="module")
def chat_run(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-data")
    _write_data(tiny, root / "chat.jsonl")
    recipe = root / "recipe.yaml"
    recipe.write_text(f"""extends: {tiny.recipes / 'sft-lora.yaml'}
model:
  tokens: ['<sound>']
data:
  datasets:
    - path: chat.jsonl
      format: messages
      messages:
        field: conversation
        role: speaker
        content: text
        roles: {{user: [customer], assistant: [agent]}}
        system_field: sys
        train_field: learn
  chat_template: llama3
  dedup: true
train:
  max_steps: 30
""")
    return tiny.train(str(recipe), root / "run")


def test_loss_falls_and_the_new_embedding_row_trains(tiny, chat_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loss = [r["loss"] for r in tiny.records(chat_run) if r.get("loss") is not None]
    assert loss[-1] < loss[0] - 2.0, loss
    tok = AutoTokenizer.from_pretrained(chat_run / "final")
    new_id = tok.convert_tokens_to_ids("<sound>")
    assert new_id >= 1024 and tok.convert_tokens_to_ids("<|eot_id|>") >= 1024  # added: the token, the template's
    base = AutoModelForCausalLM.from_pretrained(chat_run / "base_model").get_input_embeddings().weight
    merged = AutoModelForCausalLM.from_pretrained(chat_run / "merged").get_input_embeddings().weight
    assert base.shape[0] == merged.shape[0] == len(tok)
    torch.testing.assert_close(base[new_id], base[:1024].mean(dim=0))  # started at the mean of the old rows
    assert (merged[new_id] - base[new_id]).abs().max() > 1e-3  # and trained under LoRA
    torch.testing.assert_close(merged[:1024], base[:1024])  # the old rows stayed frozen
    adapter = json.loads((chat_run / "final" / "adapter_config.json").read_text())
    assert adapter["trainable_token_indices"] == {"embed_tokens": list(range(1024, len(tok)))}


def test_plan_and_log_record_the_data_changes(tiny, chat_run):
    plan = json.loads((chat_run / "plan.json").read_text())
    assert plan["reasons"]["added_tokens"]["value"] == 4  # <sound> + llama3's header and turn-end tokens
    assert "trainable_token_indices" in plan["reasons"]["added_tokens"]["reason"]
    data = [r for r in tiny.records(chat_run) if "train_rows" in r][0]
    assert data["duplicates_dropped"] == 1 and data["train_rows"] == 67  # the repeated last row
