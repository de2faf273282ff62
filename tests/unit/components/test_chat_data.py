"""Message field mappings, pre-tokenized rows, exact deduplication, and added tokens."""

from __future__ import annotations

import json

import pytest

from recipeforge.components.formats import RenderOptions, get_format
from recipeforge.components.messages import apply_message_fields, map_row, role_table
from recipeforge.components.tokenizer import build_tiny_tokenizer
from recipeforge.config.schema.data import DatasetSpec, MessageFields
from recipeforge.errors import RecipeError


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer(1024)


FIELDS = MessageFields(field="conv", role="speaker", content="text", roles={"user": ("customer",),
                       "assistant": ("agent",)}, system_field="sys", system_prompt="Be kind.", train_field="learn")


def _map(value, system=None, fields=FIELDS):
    return map_row(value, system, fields, role_table(fields.roles), row=7, key="data.datasets[0].messages")


def test_field_mappings_give_openai_messages():
    msgs = _map([{"speaker": "customer", "text": "cow?"}, {"speaker": "agent", "text": "moo", "learn": False},
                 {"speaker": "human", "text": "dog?"}, {"speaker": "gpt", "text": "woof", "learn": True}], "Be brief.")
    assert msgs == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "cow?"},
                    {"role": "assistant", "content": "moo", "train": False}, {"role": "user", "content": "dog?"},
                    {"role": "assistant", "content": "woof", "train": True}]
    default = _map([{"speaker": "customer", "text": "cow?"}], "")
    assert default[0] == {"role": "system", "content": "Be kind."}  # no system column value: the fixed prompt


@pytest.mark.parametrize("value, message, key", [
    ([{"speaker": "narrator", "text": "x"}], "row 7: message 1 has role 'narrator', which is not mapped", "roles"),
    ([{"who": "agent", "text": "x"}], "row 7: message 1 has no 'speaker' key (keys: who, text)", "role"),
    ([{"speaker": "agent", "body": "x"}], "row 7: message 1 has no 'text' key", "content"),
    ([{"speaker": "agent", "text": "x", "learn": "yes"}], "'learn': 'yes'; it must be true or false", "train_field"),
    ("not a list", "column 'conv' must be a non-empty list", "field"),
])
def test_rows_that_do_not_fit_name_row_message_and_key(value, message, key):
    with pytest.raises(RecipeError) as info:
        _map(value)
    problem = info.value.problems[0]
    assert message in problem.message and problem.key == f"data.datasets[0].messages.{key}"
    if key == "roles":  # the known roles, the recipe's among them
        assert "user: user, human, customer" in problem.hint
        assert "assistant: assistant, gpt, bot, model, agent" in problem.hint


def test_a_dataset_gets_a_messages_column():
    import datasets

    ds = datasets.Dataset.from_list([{"conv": [{"speaker": "customer", "text": "cow?"}, {"speaker": "agent",
                                      "text": "moo"}], "sys": None, "other": 1}])
    out = apply_message_fields(ds, FIELDS, key="data.datasets[0].messages")
    assert set(out.column_names) == {"messages", "other"}
    assert [(m["role"], m["content"]) for m in out[0]["messages"]] == [("system", "Be kind."), ("user", "cow?"),
                                                                       ("assistant", "moo")]
    with pytest.raises(RecipeError, match="column 'chat' not found; columns found: conv, sys, other"):
        apply_message_fields(ds, MessageFields(field="chat"), key="k")


def test_the_mappings_need_the_messages_format():
    with pytest.raises(ValueError, match="need format: messages"):
        DatasetSpec(path="a.jsonl", format="alpaca", messages={"field": "conv"})
    with pytest.raises(ValueError, match="'gpt' is listed under both user and assistant"):
        MessageFields(roles={"user": ["gpt"], "assistant": ["gpt"]})


def test_tokenized_rows_are_taken_as_they_are(tok):
    render = get_format("tokenized").render
    opts = RenderOptions(tok)
    segs = render({"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}, opts)
    assert segs == [([5, 6], False), ([7, 8], True)]
    assert render({"input_ids": [5, 6, 0], "attention_mask": [1, 1, 0]}, opts) == [([5, 6], True)]
    for row, message in (({"input_ids": [5, 6], "labels": [5]}, "column 'labels' has 1 values but input_ids has 2"),
                         ({"input_ids": [5, 1024]}, "input_ids[1] = 1024 is outside the vocabulary (0 to 1023)"),
                         ({"input_ids": [5, 6], "labels": [5, 9]}, "labels[1] = 9 is neither input_ids[1] (6)")):
        with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            render(row, opts)


def test_tokenized_errors_name_the_row(tok):
    from recipeforge.components.lm_data import tokenize_batch

    batch = {"input_ids": [[1, 2, 3], [1, 99999]], "_format": ["tokenized"] * 2, "_row": [1, 2]}
    with pytest.raises(RecipeError, match="row 2: input_ids"):
        tokenize_batch(batch, tokenizer=tok, train_on_inputs=False, sequence_len=16, truncation="truncate",
                       mask_inputs=True)


def test_exact_duplicates_are_dropped():
    import datasets

    from recipeforge.components.dedup import drop_duplicates

    a = datasets.Dataset.from_list([{"text": "x", "_row": 1}, {"text": "y", "_row": 2}, {"text": "x", "_row": 3}])
    b = datasets.Dataset.from_list([{"text": "y", "_row": 1}, {"text": "z", "_row": 2}])
    seen: set = set()
    out, n = drop_duplicates(a, seen)
    assert n == 1 and out["_row"] == [1, 2]  # the row numbers of the kept rows are their source rows
    out, n = drop_duplicates(b, seen)  # sharing `seen`: across datasets
    assert n == 1 and out["text"] == ["z"]


def test_dedup_in_the_data_pipeline(tmp_path, tok):
    from recipeforge.components.lm_data import prepare_lm_data
    from recipeforge.config import load_recipe

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["one", "two", "one", "three"]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["two", "four"]))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage: pretrain\nmodel: {name_or_path: 'tiny:llama'}\n"
                      "data: {datasets: [{path: a.jsonl, format: text}, {path: b.jsonl, format: text}], dedup: true}\n"
                      "train: {max_steps: 1}\n")
    lm = prepare_lm_data(load_recipe(recipe).recipe, tok, base_dir=tmp_path, use_cache=False)
    assert lm.stats["duplicates_dropped"] == 2 and lm.stats["train_rows"] == 4
    own = load_recipe(recipe, overrides=["data.dedup=false", "data.datasets.0.dedup=true"]).recipe
    lm = prepare_lm_data(own, tok, base_dir=tmp_path, use_cache=False)
    assert lm.stats["duplicates_dropped"] == 1 and lm.stats["train_rows"] == 5  # within dataset 0 only


def test_added_tokens_get_mean_rows_and_lora_trains_them(tmp_path):
    import torch

    from recipeforge.components.adapters import lora_config
    from recipeforge.components.models import load_model
    from recipeforge.components.vocab import prepare_tokenizer, trainable_tokens
    from recipeforge.config import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage: sft\nmodel: {name_or_path: 'tiny:qwen2', tokens: ['<tool>'], eot_tokens: ['<|eot|>'],"
                      " special_tokens: {pad_token: '<|padding|>'}}\n"
                      "data: {datasets: [{path: d.jsonl, format: messages}], chat_template: llama3}\n"
                      "adapter: {type: lora, target_modules: all-linear}\ntrain: {max_steps: 1}\n")
    r = load_recipe(recipe).recipe
    tok = build_tiny_tokenizer(1024)
    change = prepare_tokenizer(tok, r, base_dir=tmp_path)
    assert len(change.new_ids) == 6 and tok.pad_token == "<|padding|>" and "<tool>" in change.new_tokens
    assert tok.encode("a <tool> b", add_special_tokens=False).count(tok.convert_tokens_to_ids("<tool>")) == 1
    assert set(change.stop_ids) == {tok.convert_tokens_to_ids("<|eot|>"), tok.convert_tokens_to_ids("<|eot_id|>")}
    model = load_model("tiny:qwen2", tok, device="cpu", dtype="fp32", attn_implementation="sdpa", vocab=change)
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] == len(tok) == 1030
    torch.testing.assert_close(emb[1024:], emb[:1024].mean(dim=0).expand(6, -1))
    assert set(change.stop_ids) <= set(model.generation_config.eos_token_id)
    targets = trainable_tokens(model, change)
    assert targets == {"embed_tokens": list(range(1024, 1030))}  # tied output layer: peft ties it itself
    assert lora_config(r.adapter, trainable_tokens=targets).trainable_token_indices == targets
