"""An export checks itself: loaded back by its consumer, it must predict held text about as well as
the unquantized model of the run (perplexity within the format's stated bound); the greedy tokens of
both are reported next to it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Used when the run names no local evaluation data: short texts of different kinds.
FIXED_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Question: what is the capital of France? Answer: Paris.",
    "def add(a, b):\n    return a + b\n",
    "Once upon a time, a small robot learned to paint the sea.",
)
HELD_ROWS = 4
GREEDY_TOKENS = 8


@dataclass(frozen=True)
class Measure:
    """How one model did on the held texts."""

    perplexity: float
    greedy: list[list[int]]      # the first GREEDY_TOKENS tokens generated greedily after each prompt


@dataclass(frozen=True)
class CheckResult:
    """The export against the unquantized model, and whether it is within the bound."""

    texts_from: str
    reference_perplexity: float
    export_perplexity: float
    perplexity_change: float     # relative: export / reference - 1
    max_perplexity_change: float
    greedy_match: float          # the share of greedy tokens equal at the same position
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the terminal."""
        verdict = "passed" if self.passed else "FAILED"
        return (f"self-check {verdict}: perplexity {self.reference_perplexity:.4g} -> {self.export_perplexity:.4g} "
                f"({self.perplexity_change:+.3%}, bound {self.max_perplexity_change:.2%}), greedy tokens "
                f"{self.greedy_match:.0%} equal, on {self.texts_from}")


def held_texts(run_dir: Path, tokenizer) -> tuple[list[str], str]:
    """A few rows of the run's first local evaluation file (chat rows through the chat template), or
    `FIXED_TEXTS`; with where they came from."""
    import yaml

    path = Path(run_dir) / "resolved_recipe.yaml"
    recipe = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    for entry in ((recipe.get("data") or {}).get("eval_datasets") or []):
        local = Path(str((entry or {}).get("path", "")))
        if local.suffix == ".jsonl" and local.is_file():
            texts = [t for t in (_row_text(json.loads(line), tokenizer)
                                 for line in local.read_text().splitlines()[:HELD_ROWS * 4] if line.strip()) if t]
            if texts:
                return texts[:HELD_ROWS], f"{len(texts[:HELD_ROWS])} rows of {local.name}"
    return list(FIXED_TEXTS), f"{len(FIXED_TEXTS)} fixed prompts"


def _row_text(row: dict, tokenizer) -> str | None:
    if isinstance(row.get("messages"), list) and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(row["messages"], tokenize=False)
    if isinstance(row.get("text"), str):
        return row["text"]
    if isinstance(row.get("instruction"), str):  # alpaca
        return " ".join(str(row.get(k) or "") for k in ("instruction", "input", "output")).strip()
    answer = next((row[k] for k in ("completion", "chosen", "response") if isinstance(row.get(k), str)), "")
    return row["prompt"] + answer if isinstance(row.get("prompt"), str) else None


def measure(model, tokenizer, texts: list[str]) -> Measure:
    """Perplexity over all tokens of `texts` and the greedy continuation of each text's first half."""
    import torch

    nll, count, greedy = 0.0, 0, []
    device = next(model.parameters()).device
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt").input_ids[:, :256].to(device)
            if ids.shape[1] < 2:
                continue
            loss = model(input_ids=ids, labels=ids).loss.float().item()
            nll, count = nll + loss * (ids.shape[1] - 1), count + ids.shape[1] - 1
            prompt = ids[:, :max(1, ids.shape[1] // 2)]
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            greedy.append(out[0, prompt.shape[1]:].tolist())
    return Measure(perplexity=math.exp(nll / max(count, 1)), greedy=greedy)


def compare(reference: Measure, exported: Measure, *, bound: float, texts_from: str) -> CheckResult:
    """The export's numbers against the reference's; passed when the perplexity moved by at most `bound`."""
    change = exported.perplexity / reference.perplexity - 1
    pairs = [(a, b) for ra, rb in zip(reference.greedy, exported.greedy) for a, b in zip(ra, rb)]
    match = sum(a == b for a, b in pairs) / len(pairs) if pairs else 1.0
    return CheckResult(texts_from=texts_from, reference_perplexity=reference.perplexity,
                       export_perplexity=exported.perplexity, perplexity_change=change,
                       max_perplexity_change=bound, greedy_match=match,
                       passed=math.isfinite(change) and abs(change) <= bound)
