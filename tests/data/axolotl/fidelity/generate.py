"""Token ids and labels that Axolotl itself gives a fixed set of rows, one case per dataset type the
converter maps: the ground truth `tests/unit/convert/test_axolotl_fidelity.py` (SFT types, `cases.json`) and
`tests/unit/convert/test_axolotl_preference_fidelity.py` (DPO, KTO and ORPO types, `preference_cases.json`)
compare converted recipes to.

Run it on purpose, when Axolotl's prompts or the tiny tokenizer change, with an interpreter where Axolotl
imports (a virtual environment of its own: ``pip install axolotl==0.19.0 -c constraints.txt`` beside
``torch==2.13.0``; the prompt strategies need only a few of its dependencies) and from the repository root:

    python tests/data/axolotl/fidelity/generate.py

It writes, next to itself, with the Axolotl version and the tokenizer's fingerprint:

* `cases.json`: each SFT case's Axolotl dataset entry, its rows, and Axolotl's input_ids/labels for each
  row, tokenized with recipeforge's tiny tokenizer (built locally, no download);
* `preference_cases.json`: each DPO/KTO/ORPO case's `rl`, dataset entry and rows, the texts Axolotl's own
  strategy makes of each row (prompt/chosen/rejected, KTO prompt/completion/label), or the error Axolotl
  stops with for a type it does not have, and the token ids the TRL trainer Axolotl trains with makes of
  those texts (DPO and KTO: prompt/chosen/rejected or completion ids; ORPO: the chosen and rejected
  sequences with their labels).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))  # this checkout's recipeforge, for the tiny tokenizer

ALPACA = [
    {"instruction": "Name three colors.", "input": "", "output": "Red, green and blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "The sum is 5."},
]
SYSTEM_ROWS = [
    {"system": "You are terse.", "instruction": "Say hello.", "input": "", "output": "Hello."},
    {"system": "", "instruction": "Translate to French.", "input": "good day", "output": "bonjour"},
]
CASES: list[dict] = [
    *({"type": t, "rows": ALPACA} for t in ("alpaca", "alpaca:chat", "alpaca:chatml", "alpaca:phi", "alpaca_chat",
                                          "alpaca_chat.load_concise", "alpaca_chat.load_no_prompt", "alpaca_instruct",
                                          "alpaca_instruct.load_no_prompt")),
    {"type": "alpaca_chat", "conversation": "chatml", "rows": ALPACA},
    {"type": "alpaca_w_system", "rows": SYSTEM_ROWS},
    {"type": "alpaca_w_system.load_instruct", "rows": SYSTEM_ROWS},
    {"type": "alpaca_w_system.load_open_orca", "rows": [
        {"system_prompt": "You are an AI assistant.", "question": "What is 2+2?", "response": "4."},
        {"system_prompt": "", "question": "Spell cat.", "response": "c-a-t"}]},
    {"type": "alpaca_w_system.load_open_orca_chatml", "rows": [
        {"system_prompt": "Be brief.", "question": "Capital of France?", "response": "Paris."}]},
    {"type": "alpaca_chat.load_qa", "rows": [{"question": "Why is the sky blue?", "answer": "Rayleigh scattering."}]},
    {"type": "alpaca_chat.load_camel_ai", "rows": [{"message_1": "What is a prime?", "message_2": "A number with two "
                                                                                                "divisors."}]},
    {"type": "oasst", "rows": [{"INSTRUCTION": "Tell a joke.", "RESPONSE": "Why did the chicken cross the road?"}]},
    {"type": "gpteacher", "rows": [{"instruction": "Summarize.", "input": "A long story.", "response": "Short."},
                                   {"instruction": "Greet.", "input": "", "response": "Hi!"}]},
    {"type": "jeopardy", "rows": [{"question": "This planet is red.", "category": "SPACE", "answer": "Mars"}]},
    {"type": "summarizetldr", "rows": [{"article": "Cats sleep a lot. They nap all day.", "summary": "Cats nap."}]},
    # The choice types: Axolotl builds the input from `choices`; the recipe reads an `input` column built the same
    # way (the conversion report says so), which these rows carry.
    {"type": "explainchoice", "rows": [{"question": "Which is a fruit?", "choices": ["apple", "rock"],
                                        "input": '- "apple"\n- "rock"', "explanation": "An apple grows on trees."}]},
    {"type": "concisechoice", "rows": [{"question": "Which is wet?", "choices": ["water", "sand"],
                                        "input": '- "water"\n- "sand"', "explanation": "Water."}]},
    {"type": "context_qa", "rows": [{"article": "Bob has a dog.", "question": "What pet?", "answer": "A dog."}]},
    {"type": "context_qa.load_404", "rows": [{"article": "Bob has a dog.", "unanswerable_question": "Bob's age?"}]},
    {"type": "context_qa.load_v2", "rows": [{"context": "It rained.", "question": "Weather?", "answer": "Rain."}]},
    {"type": "creative_acr.load_answer", "rows": [{"instruction": "Describe rain.", "revision": "Soft silver threads."}]},
    {"type": {"system_prompt": "", "field_instruction": "question", "field_input": "context", "field_output": "answer",
              "format": "[INST] {instruction} {input} [/INST]", "no_input_format": "[INST] {instruction} [/INST]"},
     "rows": [{"question": "Who?", "context": "A story", "answer": "Me."}, {"question": "Why?", "context": "",
                                                                            "answer": "Because."}]},
    {"type": "input_output", "rows": [{"segments": [{"label": False, "text": "<|bos|>Q: hi\n"},
                                                    {"label": True, "text": "A: hello<|im_end|>"}]}]},
    {"type": "completion", "rows": [{"text": "Once upon a time there was a cat."}]},
    # Chat rows through the tokenizer's own template (cfg.chat_template: tokenizer_default, the tiny tokenizer's
    # ChatML, whose end of turn is the tokenizer's EOS).
    {"type": "chat_template", "rows": [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye."}]}]},
    {"type": "chat_template", "field_messages": "conversations",
     "message_property_mappings": {"role": "from", "content": "value"},
     "rows": [{"conversations": [{"from": "human", "value": "Name a fruit."}, {"from": "gpt", "value": "A pear."}]}]},
    # The same rows through a named template of Axolotl's (cfg.chat_template: chatml), which recipeforge names too.
    {"type": "chat_template", "config": {"chat_template": "chatml"}, "rows": [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}]}]},
    *({"type": "chat_template", "config": {"chat_template": name}, "rows": [{"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"}]}]}
      for name in ("phi_3", "llama3", "llama4", "qwen_25", "qwen3", "gemma3", "mistral_v2v3", "mistral_v3_tekken",
                   "deepseek_v3")),
]
SEQUENCE_LEN = 2048
CHAT_TEMPLATE = "tokenizer_default"


# -- DPO / KTO / ORPO -----------------------------------------------------------------------------------------
# Axolotl's preference strategies (axolotl/prompt_strategies/{dpo,kto,orpo}) turn each row into texts, which
# the TRL trainer then tokenizes. Rows with and without a system text, since the strategies write one only
# when it is not empty.
INTEL = [{"system": "You are terse.", "question": "What is 2+2?", "chosen": "4.", "rejected": "5."},
         {"system": "", "question": "Capital of France?", "chosen": "Paris.", "rejected": "Rome."}]
ICR = [{"system": "Answer in French.", "input": "Say thanks.", "chosen": "Merci.", "rejected": "Thanks."},
       {"system": "", "input": "Count to two.", "chosen": "1, 2", "rejected": "2, 1"}]
PAIRS = [{"system": "Be kind.", "prompt": "Greet me.", "chosen": "Hello, friend!", "rejected": "What?"},
         {"system": "", "prompt": "Name a color.", "chosen": "Blue.", "rejected": "Seven."}]


def _conv(user: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


ULTRA = [{"system": "", "prompt": "Name a fruit.", "chosen": _conv("Name a fruit.", "A pear."),
          "rejected": _conv("Name a fruit.", "A rock.")},
         {"system": "Be precise.", "prompt": "Is ice cold?", "chosen": _conv("Is ice cold?", "Yes."),
          "rejected": _conv("Is ice cold?", "No.")}]
ARGILLA_CHAT = [{"chosen": _conv("Hi there", "Hello!"), "rejected": _conv("Hi there", "Go away.")},
                {"chosen": _conv("2+2?", "4"), "rejected": _conv("2+2?", "22")}]
# argilla/distilabel-intel-orca-dpo-pairs: the columns Axolotl's default strategy falls back to
DISTILABEL = [{"system": "You are helpful.", "instruction": "Spell cat.", "chosen_response": "c-a-t",
               "rejected_response": "k-a-t"},
              {"system": "", "instruction": "Opposite of up?", "chosen_response": "Down.",
               "rejected_response": "Left."}]
NECTAR = [{"prompt": "Pick a number.", "answers": [{"answer": "Seven.", "model": "a", "rank": 1},
                                                   {"answer": "Three.", "model": "b", "rank": 2},
                                                   {"answer": "Banana.", "model": "c", "rank": 3}]}]
MESSAGES = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             "chosen": {"role": "assistant", "content": "Hello!"}, "rejected": {"role": "assistant", "content": "No."}},
            {"messages": [{"role": "user", "content": "Name a pet."}],
             "chosen": {"role": "assistant", "content": "A cat."},
             "rejected": {"role": "assistant", "content": "A car."}}]
KTO_ARGILLA = [{"system": "Be terse.", "instruction": "Say yes.", "completion": "Yes.", "label": True},
               {"system": "", "instruction": "Say no.", "completion": "Maybe.", "label": False}]
KTO_INTEL = [{"system": "Be terse.", "question": "2+3?", "completion": "5", "label": True},
             {"system": "", "question": "3+3?", "completion": "7", "label": False}]
KTO_PAIRS = [{"system": "Be kind.", "prompt": "Greet me.", "completion": "Hello!", "label": True},
             {"system": "", "prompt": "Greet me.", "completion": "Go away.", "label": False}]
KTO_CHAT = [{"prompt": "Hi", "completion": _conv("Hi", "Hello!"), "label": True},
            {"prompt": "Hi", "completion": _conv("Hi", "Whatever."), "label": False}]
# argilla/ultrafeedback-binarized-preferences-cleaned, ORPO's example: a prompt column beside the conversations
ORPO_ROWS = [{"prompt": "Name a fruit.", "chosen": _conv("Name a fruit.", "A pear."),
              "rejected": _conv("Name a fruit.", "A rock.")},
             {"prompt": "Is ice cold?", "chosen": _conv("Is ice cold?", "Yes."),
              "rejected": _conv("Is ice cold?", "No.")}]
# rl, the dataset entry's keys (type, field_*) and rows, and `config` keys besides the entry; a type Axolotl does
# not have gets `as` the type whose texts the converter writes for it.
PREFERENCE_CASES: list[dict] = [
    *({"rl": "dpo", "type": f"{template}.{kind}", "rows": rows}
      for template in ("chatml", "llama3")
      for kind, rows in (("intel", INTEL), ("icr", ICR), ("prompt_pairs", PAIRS), ("ultra", ULTRA),
                         ("argilla_chat", ARGILLA_CHAT))),
    {"rl": "dpo", "type": "chatml", "rows": PAIRS},
    {"rl": "dpo", "type": "llama3.default", "rows": PAIRS},
    {"rl": "dpo", "type": "chatml.argilla", "rows": DISTILABEL, "as": "chatml"},
    {"rl": "dpo", "type": "llama3.argilla", "rows": DISTILABEL, "as": "llama3"},
    {"rl": "dpo", "type": "qwen3.intel", "rows": INTEL},
    {"rl": "dpo", "type": "zephyr.nectar", "rows": NECTAR},
    {"rl": "dpo", "type": "passthrough", "rows": PAIRS},
    {"rl": "dpo", "type": {"field_prompt": "question", "prompt_format": "[SYS]{system}[/SYS] {prompt}",
                           "chosen_format": "{chosen}!", "rejected_format": "{rejected}?"}, "rows": INTEL},
    {"rl": "dpo", "type": {"field_prompt": "instruction", "field_chosen": "chosen_response",
                           "field_rejected": "rejected_response"}, "rows": DISTILABEL},
    {"rl": "dpo", "type": "chat_template.default", "rows": MESSAGES},
    {"rl": "dpo", "type": "chat_template.default", "field_messages": "conversation", "field_chosen": "good",
     "field_rejected": "bad", "rows": [{"conversation": [{"role": "user", "content": "Name a pet."}],
                                        "good": "A cat.", "bad": "A car."}]},
    {"rl": "dpo", "type": "chat_template.argilla_chat", "rows": ARGILLA_CHAT},
    {"rl": "dpo", "type": "chat_template.argilla", "rows": ARGILLA_CHAT, "as": "chat_template.argilla_chat"},
    *({"rl": "kto", "type": f"{template}.{kind}", "rows": rows}
      for template in ("chatml", "llama3")
      for kind, rows in (("argilla", KTO_ARGILLA), ("intel", KTO_INTEL), ("prompt_pairs", KTO_PAIRS),
                         ("ultra", KTO_PAIRS), ("argilla_chat", KTO_CHAT))),
    {"rl": "kto", "type": {"field_prompt": "question", "field_completion": "completion",
                           "prompt_format": "Q: {prompt}\nA: ", "completion_format": "{completion}."},
     "rows": KTO_INTEL},
    {"rl": "orpo", "type": "chat_template.argilla", "rows": ORPO_ROWS},
    {"rl": "orpo", "type": "chat_template.argilla", "rows": ARGILLA_CHAT},
    {"rl": "orpo", "type": "chatml.intel", "rows": INTEL},
    # Axolotl's own ChatML template (no BOS), as a config names it, instead of the tokenizer's
    {"rl": "dpo", "type": "chat_template.default", "rows": MESSAGES, "config": {"chat_template": "chatml"}},
    {"rl": "orpo", "type": "chat_template.argilla", "rows": ORPO_ROWS, "config": {"chat_template": "chatml"}},
]


def axolotl_texts(rl: str, entry: dict, rows: list[dict], tokenizer, config: dict) -> list[dict] | str:
    """The texts Axolotl's strategy for `entry` makes of `rows` (utils/data/rl.py `_load_split`), or the
    error Axolotl stops with when it has no such strategy."""
    from axolotl.prompt_strategies.dpo import load as load_dpo
    from axolotl.prompt_strategies.kto import load as load_kto
    from axolotl.prompt_strategies.orpo import load as load_orpo
    from axolotl.utils.data.rl import _map_dataset
    from axolotl.utils.dict import DictDefault
    from datasets import Dataset

    cfg = DictDefault({"rl": rl, "datasets": [entry], "chat_template": CHAT_TEMPLATE, "dataset_num_proc": 1,
                       "sequence_len": SEQUENCE_LEN, **config})
    kind = "user_defined.default" if isinstance(entry["type"], dict) else entry["type"]
    loader = {"orpo": load_orpo, "kto": load_kto}.get(rl, load_dpo)
    transform = loader(kind, cfg, dataset_idx=0)
    if transform is None:  # the message of Axolotl's ValueError in _load_split
        return f"Failed to load dataset transform function for type {kind!r} (rl: {rl})"
    kwargs: dict = {}
    if isinstance(transform, tuple):
        transform, kwargs = transform
    ds = Dataset.from_list(rows)
    if "remove_columns" in kwargs:
        kwargs["remove_columns"] = [c for c in kwargs["remove_columns"] if c in ds.column_names]
    out = _map_dataset(cfg, ds, transform, tokenizer, **kwargs)
    keys = ("prompt", "completion", "label") if rl == "kto" else ("prompt", "chosen", "rejected")
    return [{k: r[k] for k in keys} for r in out]


def trl_tokens(rl: str, texts: list[dict], tokenizer) -> list[dict]:
    """The token ids TRL's trainer (the one Axolotl's subclasses) makes of the texts: DPOTrainer's and
    KTOTrainer's `_prepare_dataset`, ORPOTrainer's `tokenize_row`, called on stand-ins for the trainers."""
    from types import SimpleNamespace

    from datasets import Dataset

    if rl == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        trainer = SimpleNamespace(processing_class=tokenizer, is_encoder_decoder=False, max_length=SEQUENCE_LEN)
        trainer.build_tokenized_answer = lambda prompt, answer: ORPOTrainer.build_tokenized_answer(trainer, prompt,
                                                                                                   answer)
        keys = ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")
        return [{k: v for k, v in ORPOTrainer.tokenize_row(trainer, dict(t)).items() if k in keys} for t in texts]
    if rl == "kto":
        from trl import KTOTrainer as Trainer

        keys = ("prompt_ids", "completion_ids")
    else:
        from trl import DPOTrainer as Trainer

        keys = ("prompt_ids", "chosen_ids", "rejected_ids")
    trainer = SimpleNamespace(_tokenizer=tokenizer, calculate_KL=False)
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    ds = Trainer._prepare_dataset(trainer, Dataset.from_list(texts), tokenizer, args, "train")
    return [{k: list(r[k]) for k in keys} for r in ds]


def preference_cases(tokenizer) -> list[dict]:
    out = []
    for case in PREFERENCE_CASES:
        entry = {"path": "rows.jsonl", **{k: v for k, v in case.items() if k not in ("rl", "rows", "as", "config")}}
        config = case.get("config", {})
        record: dict = {"rl": case["rl"], "entry": entry, "rows": case["rows"], "config": config}
        texts = axolotl_texts(case["rl"], entry, case["rows"], tokenizer, config)
        if isinstance(texts, str):
            record["axolotl_error"] = texts
            if "as" not in case:
                out.append(record)
                continue
            record["as"] = case["as"]
            texts = axolotl_texts(case["rl"], {**entry, "type": case["as"]}, case["rows"], tokenizer, config)
            assert not isinstance(texts, str), texts
        record["texts"] = texts
        record["tokens"] = trl_tokens(case["rl"], texts, tokenizer)
        out.append(record)
    return out


def main() -> None:
    import axolotl
    from axolotl.utils.data.sft import _parse_dataset_type
    from axolotl.utils.data.wrappers import get_dataset_wrapper
    from axolotl.utils.dict import DictDefault
    from datasets import Dataset

    from recipeforge.components.tokenizer import build_tiny_tokenizer, tokenizer_fingerprint

    tokenizer = build_tiny_tokenizer(1024)
    cfg = DictDefault({"train_on_inputs": False, "sequence_len": SEQUENCE_LEN, "dataset_num_proc": 1,
                       "chat_template": CHAT_TEMPLATE})
    out = []
    for case in CASES:
        entry = {"path": "rows.jsonl", **{k: v for k, v in case.items() if k not in ("rows", "config")}}
        base, style = _parse_dataset_type(entry["type"])
        wrapped, _ = get_dataset_wrapper(DictDefault(entry), tokenizer, DictDefault({**cfg, **case.get("config", {})}),
                                         base, Dataset.from_list(case["rows"]), style)
        tokens = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])} for r in wrapped]
        out.append({"entry": entry, "rows": case["rows"], "tokens": tokens,
                    **({"config": case["config"]} if "config" in case else {})})
    doc = {"axolotl_version": axolotl.__version__, "tokenizer": "recipeforge tiny tokenizer, vocab 1024",
           "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "sequence_len": SEQUENCE_LEN,
           "chat_template": CHAT_TEMPLATE, "cases": out}
    (HERE / "cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} cases (Axolotl {axolotl.__version__}) to {HERE / 'cases.json'}")
    import trl

    pref = preference_cases(tokenizer)
    doc = {"axolotl_version": axolotl.__version__, "trl_version": trl.__version__,
           "tokenizer": "recipeforge tiny tokenizer, vocab 1024",
           "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "sequence_len": SEQUENCE_LEN,
           "chat_template": CHAT_TEMPLATE, "cases": pref}
    (HERE / "preference_cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(pref)} cases to {HERE / 'preference_cases.json'}")


if __name__ == "__main__":
    main()
