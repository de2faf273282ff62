"""Preference and unpaired rows written as text (`data.datasets[].texts`): what a row becomes, and the errors a
recipe author sees. (Axolotl's own texts for each of its types: test_axolotl_preference_fidelity.py.)"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from recipeforge.components.data import load_split
from recipeforge.components.row_texts import columns_read, render, required_columns
from recipeforge.config.schema import DataConfig, DatasetSpec
from recipeforge.config.schema.data import RowTexts
from recipeforge.errors import RecipeError

CHATML = RowTexts(prompt="<u>{question}</u><a>", system="<s>{system}</s>", chosen="{chosen[1][content]}</a>",
                  rejected="{rejected}</a>")


def test_a_row_becomes_texts_with_the_system_text_only_when_it_is_there():
    row = {"question": "Q", "system": "S", "chosen": [{"content": "u"}, {"content": "yes"}], "rejected": "no"}
    assert render(CHATML, row, "preference") == {"prompt": "<s>S</s><u>Q</u><a>", "chosen": "yes</a>",
                                                 "rejected": "no</a>"}
    for empty in ("", None):
        assert render(CHATML, {**row, "system": empty}, "preference")["prompt"] == "<u>Q</u><a>"
    assert render(CHATML, {k: v for k, v in row.items() if k != "system"}, "preference")["prompt"] == "<u>Q</u><a>"
    # a {system} in the prompt itself reads the column, empty where it is missing (Axolotl's user_defined)
    inline = RowTexts(prompt="[{system}] {prompt}", completion="{completion}!")
    assert render(inline, {"prompt": "p", "completion": "c", "label": True}, "unpaired") == {"prompt": "[] p",
                                                                                              "completion": "c!"}


def test_the_columns_the_texts_read():
    assert columns_read("{a}-{b[0][content]}-{{literal}}") == ["a", "b"]
    assert required_columns(CHATML, "preference") == ("question", "chosen", "rejected")  # not system
    assert required_columns(RowTexts(), "unpaired") == ("prompt", "completion")


@pytest.mark.parametrize("texts, message", [
    ({"prompt": "{x.__class__}"}, "reads an attribute"),
    ({"prompt": "{0}"}, "does not start with a column name"),
    ({"prompt": "{x!r}"}, "format spec or conversion"),
    ({"chosen": "{oops"}, "\nchosen\n  expected '}' before end of string"),  # the error's location: the text
])
def test_malformed_texts_are_refused_by_the_schema(texts, message):
    with pytest.raises(ValidationError, match=message):
        RowTexts(**texts)


def test_texts_belong_to_the_preference_formats():
    with pytest.raises(ValidationError, match="`texts` needs format: preference or unpaired"):
        DatasetSpec(path="d.jsonl", format="alpaca", texts={})
    with pytest.raises(ValidationError, match="texts.completion is not a text of format preference"):
        DatasetSpec(path="d.jsonl", format="preference", texts={"completion": "{completion}"})
    with pytest.raises(ValidationError, match="texts.chosen is not a text of format unpaired"):
        DatasetSpec(path="d.jsonl", format="unpaired", texts={"chosen": "{chosen}"})


def _load(tmp_path, rows, texts, fmt="preference"):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataConfig(datasets=[{"path": "d.jsonl", "format": fmt, "columns": {"prompt": "q"}, "texts": texts}])
    return load_split(data, (fmt,), seed=0, base_dir=tmp_path, transform=lambda ds, f: ds)[0]


def test_datasets_are_read_through_their_texts(tmp_path):
    rows = [{"q": "hi", "chosen": "a", "rejected": "b", "margin": 1.0, "extra": 1}]
    train = _load(tmp_path, rows, {"prompt": "U: {prompt}\nA: ", "chosen": "{chosen}.", "rejected": "{rejected}."})
    assert [{k: r[k] for k in ("prompt", "chosen", "rejected", "margin")} for r in train] == [
        {"prompt": "U: hi\nA: ", "chosen": "a.", "rejected": "b.", "margin": 1.0}]
    assert "extra" not in train.column_names  # only the format's columns go on
    train = _load(tmp_path, [{"q": "hi", "completion": "a", "label": False}], {"completion": "<{completion}>"},
                  fmt="unpaired")
    assert (train[0]["prompt"], train[0]["completion"], train[0]["label"]) == ("hi", "<a>", False)


def test_a_row_the_texts_cannot_fill_is_named(tmp_path):
    rows = [{"q": "x", "chosen": [{"content": "a"}, {"content": "b"}], "rejected": "c"},
            {"q": "y", "chosen": [{"content": "only one"}], "rejected": "c"}]
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, rows, {"chosen": "{chosen[1][content]}"})
    p = err.value.problems[0]
    assert p.key == "data.datasets[0].texts.chosen" and p.message.startswith("row 2 of 'd.jsonl': texts.chosen")
    assert "IndexError" in p.message
    with pytest.raises(RecipeError, match="format 'preference' needs column 'topic'"):
        _load(tmp_path, rows[:1], {"prompt": "{topic}: {prompt}"})
