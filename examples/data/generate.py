"""Writes the small synthetic datasets of the tiny example recipes (deterministic; rerun to refresh).

The tasks are easy on purpose, so a 2-layer random-init model visibly learns them within a few dozen
CPU steps: animal sounds, counting, and colors of fruit.

    python examples/data/generate.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent

ANIMALS = {"cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "pig": "oink",
           "horse": "neigh", "bird": "tweet", "frog": "croak", "lion": "roar", "owl": "hoot", "mouse": "squeak",
           "bee": "buzz", "snake": "hiss", "goat": "bleat", "chicken": "cluck"}
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
FRUIT = {"apple": "red", "banana": "yellow", "cherry": "red", "grape": "purple", "lemon": "yellow",
         "orange": "orange"}
SOUND_QUESTIONS = ["What does the {a} say?", "Which sound does the {a} make?", "Tell me the sound of the {a}."]


def sound_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs of the animal-sound task."""
    return [(q.format(a=a), f"The {a} says {s}.") for a, s in ANIMALS.items() for q in SOUND_QUESTIONS]


def count_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs of the counting task."""
    out = []
    for start in range(len(NUMBERS) - 2):
        for n in (3, 4):
            if start + n <= len(NUMBERS):
                seq = NUMBERS[start:start + n]
                out.append((f"Count from {seq[0]} to {seq[-1]}.", " ".join(seq)))
    return out


def pretrain_rows(rng: random.Random, n: int = 600) -> list[dict]:
    rows = []
    animals = list(ANIMALS)
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            picks = rng.sample(animals, rng.randint(2, 4))
            text = " ".join(f"The {a} says {ANIMALS[a]}." for a in picks)
        elif kind < 0.8:
            start = rng.randint(0, len(NUMBERS) - 4)
            text = " ".join(NUMBERS[start:start + rng.randint(3, len(NUMBERS) - start)])
        else:
            picks = rng.sample(list(FRUIT), rng.randint(2, 3))
            text = " ".join(f"The {f} is {FRUIT[f]}." for f in picks)
        rows.append({"text": text})
    return rows


def arithmetic_rows(rng: random.Random, n: int = 48) -> tuple[list[dict], list[dict]]:
    """(GRPO prompts with answers, SFT conversations that call the calculator) of the arithmetic tool task."""
    prompts, chats = [], []
    for _ in range(n):
        a, b, op = rng.randint(2, 20), rng.randint(2, 20), rng.choice("+*")
        expression, value = f"{a} {op} {b}", str(a + b if op == "+" else a * b)
        user = {"role": "user", "content": f"What is {expression}?"}
        prompts.append({"prompt": [user], "answer": value})
        call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}
        # The system turn is what the tools template writes when TRL passes it the tools (GRPO's prompts).
        chats.append({"messages": [{"role": "system", "content": "Tools: calculate"}, user, {"role": "assistant", "content": "", "tool_calls": [call]},
                                   {"role": "tool", "name": "calculate", "content": value},
                                   {"role": "assistant", "content": f"{expression} = {value}."}]})
    return prompts, chats


def write_jsonl(name: str, rows: list[dict]) -> None:
    with open(HERE / name, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main() -> None:
    rng = random.Random(0)
    write_jsonl("pretrain.jsonl", pretrain_rows(rng))
    pairs = sound_pairs() + count_pairs()
    write_jsonl("sft-alpaca.jsonl", [{"instruction": q, "input": "", "output": a} for q, a in pairs])
    write_jsonl("sft-chat.jsonl", [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                                   for q, a in pairs])
    pref = []
    for q, a in sound_pairs():
        animal = a.split()[1]
        wrong = rng.choice([s for x, s in ANIMALS.items() if x != animal])
        pref.append({"prompt": q, "chosen": f" The {animal} says {ANIMALS[animal]}.",
                     "rejected": f" The {animal} says {wrong}."})
    write_jsonl("preference.jsonl", pref)
    prompts = [{"prompt": f"What does the {a} say? Answer:", "answer": s} for a, s in ANIMALS.items()]
    prompts += [{"prompt": f"Which sound does the {a} make? Answer:", "answer": s} for a, s in ANIMALS.items()]
    rng.shuffle(prompts)
    write_jsonl("prompts.jsonl", prompts)
    tool_prompts, tool_chats = arithmetic_rows(random.Random(7))
    write_jsonl("tool-prompts.jsonl", tool_prompts)
    write_jsonl("tool-sft.jsonl", tool_chats)


if __name__ == "__main__":
    main()
