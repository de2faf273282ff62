"""Writes the tiny vision-language example data: six solid-colour PNG squares (32x32) in this folder and
the three datasets next to it that ask about them (deterministic; rerun to refresh).

The answer is the image's colour, so a model only gets it right by looking at the image.

    python examples/data/images/make_images.py

PIL only (no torchvision).
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

HERE = Path(__file__).parent
DATA = HERE.parent
SIZE = 32
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 60, 220), "yellow": (240, 220, 40),
           "purple": (130, 40, 170), "orange": (245, 140, 20)}
QUESTIONS = ["What colour is this square?", "Which colour is shown?", "Name the colour in the picture.",
             "What colour is the image?"]


def image_path(colour: str) -> str:
    """The image of `colour`, relative to the datasets' folder (where image paths start)."""
    return f"images/{colour}.png"


def write_images() -> None:
    for colour, rgb in COLOURS.items():
        Image.new("RGB", (SIZE, SIZE), rgb).save(HERE / f"{colour}.png", optimize=True)


def sft_rows() -> list[dict]:
    """Content-list layout: the image entry before the question in even rows, after it in odd ones."""
    rows = []
    for q, question in enumerate(QUESTIONS):
        for c, colour in enumerate(COLOURS):
            image = {"type": "image", "image": image_path(colour)}
            text = {"type": "text", "text": question}
            content = [image, text] if (q + c) % 2 == 0 else [text, image]
            rows.append({"messages": [{"role": "user", "content": content},
                                      {"role": "assistant", "content": [{"type": "text", "text": colour}]}]})
    return rows


def llava_rows() -> list[dict]:
    """LLaVA / ShareGPT layout: an `image` column and a `<image>` placeholder in the human turn."""
    rows = []
    for question in QUESTIONS[:2]:
        for colour in COLOURS:
            rows.append({"image": image_path(colour),
                         "conversations": [{"from": "human", "value": f"<image>\n{question}"},
                                           {"from": "gpt", "value": colour}]})
    return rows


def dpo_rows() -> list[dict]:
    """A question about an image; chosen: its colour, rejected: the next colour in the list."""
    names = list(COLOURS)
    rows = []
    for k in range(16):
        colour, question = names[k % len(names)], QUESTIONS[k % len(QUESTIONS)]
        wrong = names[(k % len(names) + 1 + k // len(names)) % len(names)]
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image", "image": image_path(colour)},
                                                              {"type": "text", "text": question}]}],
                     "chosen": colour, "rejected": wrong})
    return rows


def write_jsonl(name: str, rows: list[dict]) -> None:
    with open(DATA / name, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    write_images()
    write_jsonl("vlm-sft.jsonl", sft_rows())
    write_jsonl("vlm-sft-llava.jsonl", llava_rows())
    write_jsonl("vlm-dpo.jsonl", dpo_rows())
