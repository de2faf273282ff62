"""A converted Axolotl config trains the tokens Axolotl would: for every dataset type in
`tests/data/axolotl/fidelity/cases.json`, the rows go through the converted recipe's data pipeline and
the input ids and labels equal those Axolotl itself produced (the file says which Axolotl version).

To regenerate the ground truth on purpose (Axolotl's prompts or the tiny tokenizer changed), run
``python tests/data/axolotl/fidelity/generate.py`` with an interpreter where Axolotl imports.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import convert_config
from recipeforge.config.axolotl.chat_templates import TEMPLATE_CHANGES

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = json.loads((ROOT / "tests/data/axolotl/fidelity/cases.json").read_text())
REGENERATE = "regenerate with: python tests/data/axolotl/fidelity/generate.py (needs Axolotl importable)"


def _id(case: dict) -> str:
    kind = case["entry"]["type"]
    name = "user_defined" if isinstance(kind, dict) else kind
    return name + ("+conversation" if "conversation" in case["entry"] else "") + \
        ("+field_messages" if "field_messages" in case["entry"] else "") + \
        "".join(f"+{value}" for value in case.get("config", {}).values())


@pytest.fixture(scope="module")
def tokenizer():
    from recipeforge.components.tokenizer import load_tokenizer, tokenizer_fingerprint

    tok = load_tokenizer("tiny:llama")
    assert tokenizer_fingerprint(tok) == FIXTURES["tokenizer_fingerprint"], f"the tiny tokenizer changed: {REGENERATE}"
    return tok


def converted_tokens(case: dict, tokenizer, tmp_path: Path, **extra) -> tuple[list, list, object]:
    """The converted recipe's input ids and labels of the case's rows, in order, and the conversion."""
    from recipeforge.components.lm_data import prepare_lm_data

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in case["rows"]))
    config = {"base_model": "tiny:llama", "datasets": [case["entry"]], "sequence_len": FIXTURES["sequence_len"],
              "shuffle_merged_datasets": False, "micro_batch_size": 1, "num_epochs": 1,
              "chat_template": FIXTURES["chat_template"], **case.get("config", {}), **extra}
    conv = convert_config(config, tmp_path / "axolotl.yaml")
    (tmp_path / "recipe.yaml").write_text(conv.recipe_text())
    recipe = load_recipe(tmp_path / "recipe.yaml").recipe
    lm = prepare_lm_data(recipe, _prepared(tokenizer, tmp_path), base_dir=tmp_path, use_cache=False)
    return [list(r) for r in lm.train["input_ids"]], [list(r) for r in lm.train["labels"]], conv


def _prepared(tokenizer, tmp_path: Path):
    """The tokenizer as the converted recipe in `tmp_path` prepares it (its chat template and tokens)."""
    from recipeforge.components.vocab import prepare_tokenizer

    tokenizer = copy.deepcopy(tokenizer)
    prepare_tokenizer(tokenizer, load_recipe(tmp_path / "recipe.yaml").recipe, base_dir=tmp_path)
    return tokenizer


def _texts(ids: list, labels: list, tokenizer) -> list[tuple[str, str]]:
    """Each row's text and the text of its trained tokens."""
    return [(tokenizer.decode(row), tokenizer.decode([i for i, label in zip(row, lab) if label != -100]))
            for row, lab in zip(ids, labels)]


def test_the_fixtures_come_from_axolotl_and_cover_every_prompter():
    assert FIXTURES["axolotl_version"] == "0.19.0"
    kinds = {_id(c) for c in FIXTURES["cases"]}
    for kind in ("alpaca", "alpaca:chatml", "alpaca_chat", "alpaca_w_system", "alpaca_w_system.load_open_orca",
                 "oasst", "gpteacher", "jeopardy", "context_qa", "context_qa.load_v2", "summarizetldr",
                 "user_defined", "input_output", "completion", "chat_template",
                 "chat_template+field_messages"):
        assert kind in kinds
    # Axolotl's alpaca prompt, as its users send it: the ground truth is that prompt, not a chat template
    from recipeforge.components.tokenizer import load_tokenizer

    alpaca = next(c for c in FIXTURES["cases"] if _id(c) == "alpaca")
    text = load_tokenizer("tiny:llama").decode(alpaca["tokens"][0]["input_ids"])
    assert text.startswith("<|bos|>Below is an instruction that describes a task. Write a response that "
                           "appropriately completes the request.\n\n### Instruction:\nName three colors.\n\n"
                           "### Response:\n")


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=[_id(c) for c in FIXTURES["cases"]])
def test_converted_recipe_trains_axolotls_tokens(case, tokenizer, tmp_path):
    ids, labels, conv = converted_tokens(case, tokenizer, tmp_path)
    want_ids = [t["input_ids"] for t in case["tokens"]]
    want_labels = [t["labels"] for t in case["tokens"]]
    template = case.get("config", {}).get("chat_template")
    if template is not None:
        # A named template of both tools. The tiny tokenizer lacks its markers (<|eot_id|>, <think>, ...), which a
        # model's tokenizer has: recipeforge adds them as tokens, Axolotl splits them, so the texts are compared.
        ours, axolotls = _texts(ids, labels, _prepared(tokenizer, tmp_path)), _texts(want_ids, want_labels, tokenizer)
        if template in TEMPLATE_CHANGES:  # they differ, and the report says how
            assert ours != axolotls, f"{template} now trains Axolotl's text: take it out of TEMPLATE_CHANGES"
            assert conv.changes["chat_template"] == TEMPLATE_CHANGES[template]
        else:
            assert ours == axolotls and "chat_template" not in conv.changes, (ours, axolotls, conv.changes)
        return
    assert ids == want_ids, f"{_id(case)}: other token ids than Axolotl's\n{tokenizer.decode(ids[0])!r}\n" \
                            f"{tokenizer.decode(want_ids[0])!r}"
    assert labels == want_labels, f"{_id(case)}: other labels than Axolotl's"
    changes = [k for k in conv.changes if k.startswith("datasets[0]")]
    if "choices" in case["rows"][0]:  # equal only because these rows carry the input Axolotl builds: reported
        assert "choices" in conv.changes["datasets[0].type"]
    else:  # nothing differs, so the report names no semantic change for the dataset or its template
        assert not changes and "chat_template" not in conv.changes, conv.changes


def test_train_on_inputs_trains_the_prompt_as_axolotl_does(tokenizer, tmp_path):
    case = next(c for c in FIXTURES["cases"] if _id(c) == "alpaca")
    ids, labels, _ = converted_tokens(case, tokenizer, tmp_path, train_on_inputs=True)
    assert labels == ids  # Axolotl: labels are the input ids, BOS included


def test_a_prompted_recipe_needs_no_chat_template_and_chat_sends_axolotls_prompt(tmp_path):
    """The model trained on Axolotl's alpaca prompt is chatted with in that prompt (the saved tokenizer's
    chat template writes it), not in the tokenizer's own chat template."""
    from recipeforge.components.text_prompt import chat_template
    from recipeforge.components.tokenizer import load_tokenizer

    conv = convert_config({"base_model": "tiny:llama", "datasets": [{"path": "rows.jsonl", "type": "alpaca"}]})
    (tmp_path / "recipe.yaml").write_text(conv.recipe_text())
    prompt = load_recipe(tmp_path / "recipe.yaml").recipe.data.datasets[0].prompt
    tok = load_tokenizer("tiny:llama")
    tok.chat_template = chat_template(prompt, bos=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "Name three colors."}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    case = next(c for c in FIXTURES["cases"] if _id(c) == "alpaca")
    row = case["tokens"][0]
    prompt_ids = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab == -100]
    assert list(ids) == prompt_ids  # what Axolotl trained as the prompt, token for token
