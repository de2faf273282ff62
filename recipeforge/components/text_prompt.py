"""Instruction prompts written as text (`data.datasets[].prompt`): a row's prompt and reply as plain strings.

This is the prompt model of Axolotl's instruction prompters (alpaca and its relatives, and its
`user_defined` types): an optional system text, then one of two turn templates (with or without an
input), and the reply after it. Templates are Python format strings whose placeholders name columns
of the row (``{instruction}``, ``{input}``, or any other column), so a prompter that joins several
columns (context + question) is written the same way.

A dataset with a prompt becomes ``prompt``/``completion`` rows, which the `completion` format
tokenizes as Axolotl's `InstructionPromptTokenizingStrategy` does: the prompt (after the tokenizer's
BOS, if it writes one) and the reply are tokenized apart, the reply is followed by EOS, and only the
reply and its EOS are trained unless `data.train_on_inputs` is set.

Nothing here imports torch, transformers or datasets at module level.
"""

from __future__ import annotations

import json
import string

from recipeforge.errors import RecipeError

# The placeholders that mean something besides a column: the input decides which turn template a row
# uses, and the system text comes from the row (`row_system`) or the prompt's own `system` texts.
INPUT, SYSTEM = "input", "system"


def placeholders(template: str) -> list[str]:
    """The names of the ``{placeholders}`` in a format string, in order; a malformed one is a ValueError."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if not name.isidentifier():
            raise ValueError(f"'{{{name}}}' is not a column name (write a literal brace as {{{{ or }}}})")
        if spec or conversion:
            raise ValueError(f"'{{{name}...}}' has a format spec or conversion; write plain {{{name}}}")
        names.append(name)
    return names


def columns(prompt) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The row columns a prompt reads: (required, optional). A column is required when every row needs it
    (the turn without input, the output); the input, the system text and columns only the turn with an
    input reads are optional."""
    always = placeholders(prompt.turn_no_input) + placeholders(prompt.output_format)
    required = tuple(dict.fromkeys(n for n in always if n not in (INPUT, SYSTEM)))
    optional = [n for n in placeholders(prompt.turn) if n not in required and n != SYSTEM]
    optional += [INPUT] + ([SYSTEM] if prompt.row_system else [])
    return required, tuple(dict.fromkeys(optional))


def _text(value: object) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def render(prompt, row: dict) -> tuple[str, str]:
    """The prompt text and the reply text of one row, as Axolotl's prompters build them."""
    values = {k: _text(v) for k, v in row.items()}
    has_input = bool(values.get(INPUT))
    if prompt.row_system and values.get(SYSTEM):
        system = values[SYSTEM]
    elif has_input or prompt.system_no_input is None:
        system = prompt.system or ""
    else:
        system = prompt.system_no_input
    values[SYSTEM] = system
    head = prompt.system_format.format_map(_Missing(values)) if system else ""
    turn = (prompt.turn if has_input else prompt.turn_no_input).format_map(_Missing(values))
    return head + turn, prompt.output_format.format_map(_Missing(values))


class _Missing(dict):
    """Values for a format string: a column the row lacks reads as empty (an optional column)."""

    def __missing__(self, key: str) -> str:
        return ""


def to_completion_rows(ds, prompt, *, key: str, where=None):
    """The dataset with `prompt`/`completion` columns rendered by `prompt` (other columns dropped)."""
    import datasets

    required, optional = columns(prompt)
    found = list(ds.column_names)
    missing = [c for c in required if c not in found]
    if missing:
        raise RecipeError(f"column '{missing[0]}' (read by the prompt) not found; columns found: {', '.join(found)}",
                          key=f"{key}.prompt", location=where,
                          hint=f"rename a column to it with columns: {{{missing[0]}: <your column>}}")
    read = [c for c in (*required, *optional) if c in found]

    def convert(batch):
        n = len(batch[read[0]]) if read else 0
        out = [render(prompt, {c: batch[c][i] for c in read}) for i in range(n)]
        return {"prompt": [p for p, _ in out], "completion": [c for _, c in out]}

    datasets.disable_progress_bars()
    try:
        cached = {} if isinstance(ds, datasets.IterableDataset) else {"load_from_cache_file": False}
        return ds.map(convert, batched=True, remove_columns=found, **cached)
    finally:
        datasets.enable_progress_bars()


def chat_template(prompt, *, bos: bool) -> str | None:
    """A Jinja chat template that writes conversations the way `prompt` writes rows, so that chatting
    with and serving the trained model sends the prompt it was trained on: a system message (else the
    prompt's own system text), each user message as the instruction of a turn without input, each
    assistant reply followed by EOS. None when the prompt reads columns a conversation does not have."""
    names = set(placeholders(prompt.turn_no_input) + placeholders(prompt.system_format))
    if not names <= {"instruction", SYSTEM} or placeholders(prompt.output_format) != ["output"]:
        return None
    before, _, after = prompt.output_format.partition("{output}")

    def jinja(template: str, **values: str) -> str:
        parts = []
        for literal, name, _, _ in string.Formatter().parse(template):
            if literal:
                parts.append("{{ " + json.dumps(literal) + " }}")
            if name is not None:
                parts.append(values[name])
        return "".join(parts)

    default = prompt.system_no_input if prompt.system_no_input is not None else (prompt.system or "")
    system_default = json.dumps(default)
    return (
        ("{{ bos_token }}" if bos else "")
        + "{%- set ns = namespace(system=" + system_default + ") -%}"
        + "{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endfor -%}"
        + "{%- if ns.system -%}" + jinja(prompt.system_format, system="{{ ns.system }}") + "{%- endif -%}"
        + "{%- for m in messages -%}"
        + "{%- if m['role'] == 'user' -%}" + jinja(prompt.turn_no_input, instruction="{{ m['content'] }}", system="")
        + "{%- elif m['role'] == 'assistant' -%}{% generation %}" + jinja(before) + "{{ m['content'] }}"
        + jinja(after) + "{{ eos_token }}{% endgeneration %}"
        + "{%- endif -%}{%- endfor -%}"
    )
