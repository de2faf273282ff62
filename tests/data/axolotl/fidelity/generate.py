"""Token ids and labels that Axolotl itself gives a fixed set of rows, one case per dataset type the
converter maps: the ground truth `tests/unit/convert/test_axolotl_fidelity.py` compares converted recipes to.

Run it on purpose, when Axolotl's prompts or the tiny tokenizer change, with an interpreter where Axolotl
imports (a virtual environment of its own: ``pip install axolotl==0.19.0 -c constraints.txt`` beside
``torch==2.13.0``; the prompt strategies need only a few of its dependencies) and from the repository root:

    python tests/data/axolotl/fidelity/generate.py

It writes `cases.json` next to itself: each case's Axolotl dataset entry, its rows, and Axolotl's
input_ids/labels for each row, tokenized with recipeforge's tiny tokenizer (built locally, no download),
with the Axolotl version and the tokenizer's fingerprint.
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
]
SEQUENCE_LEN = 2048
CHAT_TEMPLATE = "tokenizer_default"


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
        entry = {"path": "rows.jsonl", **{k: v for k, v in case.items() if k != "rows"}}
        base, style = _parse_dataset_type(entry["type"])
        wrapped, _ = get_dataset_wrapper(DictDefault(entry), tokenizer, cfg, base, Dataset.from_list(case["rows"]),
                                         style)
        tokens = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])} for r in wrapped]
        out.append({"entry": entry, "rows": case["rows"], "tokens": tokens})
    doc = {"axolotl_version": axolotl.__version__, "tokenizer": "recipeforge tiny tokenizer, vocab 1024",
           "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "sequence_len": SEQUENCE_LEN,
           "chat_template": CHAT_TEMPLATE, "cases": out}
    (HERE / "cases.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} cases (Axolotl {axolotl.__version__}) to {HERE / 'cases.json'}")


if __name__ == "__main__":
    main()
