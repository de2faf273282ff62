"""Tokenizer vocabularies read from a local directory's files (tokenizer.json, or vocab.json with
added_tokens.json), without transformers: what `validate` compares between a student and a teacher.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping


def read_vocab(directory: str | Path) -> dict[str, int] | None:
    """token -> id of the tokenizer saved in `directory`, or None when its files do not say (no
    tokenizer.json or vocab.json, or a format not read here)."""
    path = Path(directory).expanduser()
    try:
        if (path / "tokenizer.json").is_file():
            data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
            model = data.get("model") or {}
            raw = model.get("vocab")
            if isinstance(raw, dict):
                vocab = {str(k): int(v) for k, v in raw.items()}
            elif isinstance(raw, list):  # Unigram: [piece, score] in id order
                vocab = {str(item[0]): i for i, item in enumerate(raw)}
            else:
                return None
            for token in data.get("added_tokens") or []:
                vocab[str(token["content"])] = int(token["id"])
            return vocab
        if (path / "vocab.json").is_file():
            vocab = {str(k): int(v) for k, v in json.loads((path / "vocab.json").read_text(encoding="utf-8")).items()}
            added = path / "added_tokens.json"
            if added.is_file():
                vocab.update({str(k): int(v) for k, v in json.loads(added.read_text(encoding="utf-8")).items()})
            return vocab
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return None


def first_difference(student: Mapping[str, int], teacher: Mapping[str, int]) -> str | None:
    """The first way the two vocabularies differ (by id, then by token), or None when they are the same."""
    if len(student) != len(teacher):
        extra = sorted(set(student) ^ set(teacher))
        example = f" (e.g. {extra[0]!r} is in one only)" if extra else ""
        return f"the student's has {len(student)} tokens and the teacher's {len(teacher)}{example}"
    by_id = {i: t for t, i in teacher.items()}
    for token, i in sorted(student.items(), key=lambda item: item[1]):
        if by_id.get(i) != token:
            other = by_id.get(i)
            return (f"token id {i} is {token!r} for the student and "
                    f"{repr(other) if other is not None else 'missing'} for the teacher")
    return None
