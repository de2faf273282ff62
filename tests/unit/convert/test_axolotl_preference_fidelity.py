"""A converted Axolotl DPO/KTO/ORPO config trains the tokens Axolotl would: for every preference type in
`tests/data/axolotl/fidelity/preference_cases.json`, the rows go through the converted recipe's stage data
preparation, and what the recipe hands TRL's trainer equals the texts Axolotl's own strategy hands it; the
token ids TRL makes of them (mirrored here, without importing TRL) equal those recorded from TRL itself.
Where the recipe cannot train the same tokens, the conversion report says so, and the test checks that
the tokens differ exactly as it says. A type Axolotl does not have (it stops on it) is reported as such.

To regenerate the ground truth on purpose (Axolotl's strategies, TRL or the tiny tokenizer changed), run
``python tests/data/axolotl/fidelity/generate.py`` with an interpreter where Axolotl imports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipeforge.config import load_recipe
from recipeforge.config.axolotl import convert_config, preference
from recipeforge.errors import RecipeError

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = json.loads((ROOT / "tests/data/axolotl/fidelity/preference_cases.json").read_text())
REGENERATE = "regenerate with: python tests/data/axolotl/fidelity/generate.py (needs Axolotl importable)"
IGNORE = -100
# Types the recipe trains otherwise than Axolotl, each with the report line that says how.
REPORTED = {("dpo", "chat_template.default"): preference.CHAT_TEMPLATE_TEXT,
            ("dpo", "chat_template.argilla_chat"): preference.CHAT_TEMPLATE_TEXT,
            ("dpo", "chat_template.argilla"): preference.CHAT_TEMPLATE_TEXT,
            ("kto", "chatml.argilla_chat"): preference.KTO_CHAT, ("kto", "llama3.argilla_chat"): preference.KTO_CHAT}
# Types the recipe does not write (the report says "not supported"): the rows must be changed first.
UNSUPPORTED = {("dpo", "zephyr.nectar")}


def _name(case: dict) -> str:
    kind = case["entry"]["type"]
    return "user_defined" if isinstance(kind, dict) else kind


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for case in FIXTURES["cases"]:
        name = f"{case['rl']}:{_name(case)}" + "".join(f"+{k}={v}" for k, v in case["config"].items())
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


@pytest.fixture(scope="module")
def tokenizer():
    from recipeforge.components.tokenizer import load_tokenizer, tokenizer_fingerprint

    tok = load_tokenizer("tiny:llama")
    assert tokenizer_fingerprint(tok) == FIXTURES["tokenizer_fingerprint"], f"the tiny tokenizer changed: {REGENERATE}"
    return tok


def convert(case: dict, tmp_path: Path):
    """The conversion of a config training the case's dataset entry, and its recipe (loaded)."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in case["rows"]))
    config = {"base_model": "tiny:llama", "rl": case["rl"], "datasets": [case["entry"]],
              "sequence_len": FIXTURES["sequence_len"], "shuffle_merged_datasets": False, "micro_batch_size": 2,
              "num_epochs": 1, "chat_template": FIXTURES["chat_template"], **case.get("config", {})}
    conv = convert_config(config, tmp_path / "axolotl.yaml")
    (tmp_path / "recipe.yaml").write_text(conv.recipe_text())
    return conv, load_recipe(tmp_path / "recipe.yaml")


def trainer_rows(loaded) -> tuple[list[dict], object]:
    """The training rows the recipe's stage hands TRL's trainer, in order, and the stage's tokenizer."""
    from recipeforge.stages import runner_class
    from recipeforge.stages.base import RecipeContext

    runner = runner_class(loaded.recipe.stage)(RecipeContext(loaded=loaded))
    runner.tokenizer = runner.load_tokenizer()
    data = runner.prepare_data()
    return [dict(r) for r in data.train], runner.tokenizer


# -- TRL 1.16's tokenization of the rows its trainers get (trl/trainer/dpo_trainer.py and kto_trainer.py
# `_prepare_dataset`, trl/experimental/orpo `tokenize_row`), mirrored so that this test does not import TRL.

def _common(a: list, b: list) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _chat_ids(tok, messages: list[dict], **kwargs) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"])


def dpo_kto_tokens(row: dict, tok, answers: tuple[str, ...]) -> dict:
    """DPOTrainer / KTOTrainer: prompt and prompt+answer tokenized, the answer where they part; a text
    answer gets EOS unless it ends with it; messages go through the chat template."""
    if isinstance(row["prompt"], list):
        prompt = _chat_ids(tok, row["prompt"], add_generation_prompt=True)
        full = {a: _chat_ids(tok, row["prompt"] + row[a]) for a in answers}
    else:
        prompt = list(tok(row["prompt"])["input_ids"])
        eos = tok.eos_token
        full = {a: list(tok(row["prompt"] + row[a] + ("" if row[a].endswith(eos) else eos))["input_ids"])
                for a in answers}
    n = min(_common(prompt, full[a]) for a in answers)
    return {"prompt_ids": prompt[:n], **{f"{a}_ids": full[a][n:] for a in answers}}


def orpo_tokens(row: dict, tok) -> dict:
    """ORPOTrainer: messages rendered to text by TRL's `apply_chat_template`, then prompt and prompt+answer
    tokenized without special tokens, BOS put first and EOS last when missing, the prompt's labels -100."""
    prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
    if isinstance(prompt, list):
        text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        whole = {a: tok.apply_chat_template(prompt + row[a], tokenize=False) for a in ("chosen", "rejected")}
        for full in whole.values():
            text = text[:_common(list(text), list(full))]
        prompt, chosen, rejected = text, whole["chosen"][len(text):], whole["rejected"][len(text):]
    out = {}
    for name, answer in (("chosen", chosen), ("rejected", rejected)):
        full = list(tok(prompt + answer, add_special_tokens=False)["input_ids"])
        alone = list(tok(prompt, add_special_tokens=False)["input_ids"])
        start = len(alone) - (alone != full[:len(alone)])  # a prompt token merged with the answer's
        head, tail = full[:start], full[start:]
        if not head or head[0] != tok.bos_token_id:
            head = [tok.bos_token_id] + head
        if not tail or tail[-1] != tok.eos_token_id:
            tail = tail + [tok.eos_token_id]
        out[f"{name}_input_ids"] = head + tail
        out[f"{name}_labels"] = [IGNORE] * len(head) + tail
    return out


def extract_prompt(row: dict) -> dict:
    """TRL's `extract_prompt`, for rows without a prompt: the turns chosen and rejected share are the prompt."""
    n = _common(row["chosen"], row["rejected"])
    return {"prompt": row["chosen"][:n], "chosen": row["chosen"][n:], "rejected": row["rejected"][n:]}


def trl_tokens(rl: str, row: dict, tok) -> dict:
    if row.get("prompt") is None:
        row = extract_prompt(row)
    if rl == "orpo":
        return orpo_tokens(row, tok)
    return dpo_kto_tokens(row, tok, ("completion",) if rl == "kto" else ("chosen", "rejected"))


# -- the cases ---------------------------------------------------------------------------------------------

def test_the_fixtures_come_from_axolotl_and_cover_every_type():
    assert (FIXTURES["axolotl_version"], FIXTURES["trl_version"]) == ("0.19.0", "1.16.0")
    covered = {(c["rl"], _name(c)) for c in FIXTURES["cases"]}
    for rl, modules in preference.AXOLOTL_TYPES.items():  # every type of Axolotl's the converter knows has a case
        for module, functions in modules.items():
            for function in functions:
                kind = module if (module, function) in (("chatml", "default"), ("passthrough", "default")) \
                    else f"{module}.{function}"
                assert (rl, kind) in covered, (rl, kind)
    assert {("dpo", "user_defined"), ("kto", "user_defined"), ("dpo", "chatml.argilla")} <= covered
    # what Axolotl's chatml.intel writes, as its users send it: the ground truth is Axolotl's own text
    intel = next(c for c in FIXTURES["cases"] if (c["rl"], _name(c)) == ("dpo", "chatml.intel"))
    assert intel["texts"][0] == {"prompt": "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n"
                                           "What is 2+2?<|im_end|>\n<|im_start|>assistant\n",
                                 "chosen": "4.<|im_end|>", "rejected": "5.<|im_end|>"}


@pytest.mark.parametrize("case", FIXTURES["cases"], ids=_ids())
def test_converted_recipe_trains_axolotls_tokens(case, tokenizer, tmp_path):
    conv, loaded = convert(case, tmp_path)
    kind, rl = _name(case), case["rl"]
    type_note = conv.notes.get("datasets[0].type", "")
    if "axolotl_error" in case:  # Axolotl stops on the type: the report says so
        assert "Failed to load dataset transform function" in case["axolotl_error"]
        assert "stops on" in type_note, type_note
        if "as" not in case:
            return
    if (rl, kind) in UNSUPPORTED:
        assert "is not supported" in type_note
        with pytest.raises(RecipeError, match="needs columns 'chosen', 'rejected'"):
            trainer_rows(loaded)
        return
    rows, tok = trainer_rows(loaded)
    changes = {k: v for k, v in conv.changes.items() if k.startswith("datasets[0]")}
    got = [trl_tokens(rl, row, tok) for row in rows]
    want = case["tokens"]
    if (rl, kind) in REPORTED:
        assert changes == {"datasets[0].type": REPORTED[rl, kind]}
        if rl == "kto":  # the prompt's turns in another markup: the tokens differ, as the report says
            assert got != want
            return
        # Where Axolotl's text starts with the template's BOS, TRL's tokenizer call adds another; its answers
        # end where their text does. The report says both; nothing else differs.
        for ours, theirs, text in zip(got, want, case["texts"], strict=True):
            twice = [tok.bos_token_id] if text["prompt"].startswith(tok.bos_token) else []
            assert theirs["prompt_ids"] == twice + ours["prompt_ids"]
            for answer in ("chosen_ids", "rejected_ids"):
                cut = len(theirs[answer])
                assert ours[answer][:cut] == theirs[answer] and tok.decode(ours[answer][cut:]).strip() == ""
                assert ours[answer][cut:], "the report names a difference that is not there"
        return
    if isinstance(rows[0].get("prompt"), str):  # the recipe hands TRL texts: Axolotl's
        assert [{k: r[k] for k in case["texts"][0]} for r in rows] == case["texts"], f"{kind}: other texts"
    assert got == want, f"{kind}: other token ids than Axolotl's\n{tok.decode(got[0][next(iter(got[0]))])!r}"
    if (rl, kind) == ("orpo", "chat_template.argilla"):  # rows with a system column would differ: reported
        assert changes == {"datasets[0].type": preference.ORPO_SYSTEM}
    else:
        assert not changes, changes


def test_the_same_types_serve_ipo_and_simpo(tmp_path):
    """Axolotl reads ipo and simpo datasets with its DPO strategies; so does the converter."""
    case = next(c for c in FIXTURES["cases"] if (c["rl"], _name(c)) == ("dpo", "llama3.ultra"))
    dpo = convert(case, tmp_path)[0].recipe["data"]["datasets"]
    for rl in ("ipo", "simpo"):
        assert convert({**case, "rl": rl}, tmp_path)[0].recipe["data"]["datasets"] == dpo
