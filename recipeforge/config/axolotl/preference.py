"""Axolotl's DPO, KTO and ORPO dataset types (`type:` of a `datasets:` entry when `rl:` is set) as recipe datasets.

Axolotl 0.19.0 turns each row into texts with a strategy of `axolotl/prompt_strategies/{dpo,kto,orpo}`,
named `module.function` (`module` alone: its `default`), and hands them to TRL's trainer:

* `chatml.*` and `llama3.*` write the prompt, a system text when the row has one, and each answer as
  text in the template's markup. The recipe writes the same texts (`datasets[].texts`), so TRL gets the
  same strings; `data.chat_template` is not set from the type, since Axolotl writes the markup as text
  and does not add the template's tokens to the tokenizer.
* `user_defined` (a `type:` mapping): its `prompt_format`, `chosen_format`, ... are texts too.
* DPO's `chat_template.*` renders the messages with the chat template itself; the recipe hands TRL the
  messages, which tokenizes them slightly otherwise (reported, with how to match).
* ORPO's `chat_template.argilla`: Axolotl renders the messages as TRL's ORPO trainer does with
  messages, which is what the recipe hands it.

A type Axolotl does not have (it stops with "Failed to load dataset transform function") or one the
recipe cannot write is reported as such. `tests/data/axolotl/fidelity/preference_cases.json` holds the
texts and token ids Axolotl gives each type's rows; `tests/unit/convert/test_axolotl_preference_fidelity.py`
compares the converted recipes to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass, field

from recipeforge.config.axolotl.chat_templates import chat_template_key, jinja_key

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

# The markup of Axolotl's text strategies, per module: the system text (written when the row has one), the
# user's turn up to the assistant's, and the end of each answer.
TEXT_TEMPLATES: dict[str, dict[str, str]] = {
    "chatml": {"system": "<|im_start|>system\n{system}<|im_end|>\n",
               "user": "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n", "end": "<|im_end|>"},
    "llama3": {"system": "<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
               "user": "<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n", "end": "<|eot_id|>"},
}


@dataclass(frozen=True)
class TextType:
    """A text strategy of those modules: the columns it reads (as renames to the format's column names), where
    the user's text and each answer are in the row, and whether it writes the row's system text."""

    columns: dict[str, str] = field(default_factory=dict)
    prompt: str = "{prompt}"
    answer: str = "{%s}"  # %s: the answer's column (chosen, rejected, completion)
    system: bool = True


# DPO strategies (chatml.py and llama3.py have the same ones).
PREFERENCE_TYPES: dict[str, TextType] = {
    "intel": TextType({"prompt": "question"}),
    "icr": TextType({"prompt": "input"}),
    "prompt_pairs": TextType(),
    "ultra": TextType(answer="{%s[1][content]}"),
    "argilla_chat": TextType(prompt="{chosen[0][content]}", answer="{%s[1][content]}", system=False),
    "default": TextType(),
}
DEFAULT_COLUMNS = ("Axolotl's default strategy reads the first of the columns prompt, input, question and instruction "
                   "that the rows have (and chosen or chosen_response, rejected or rejected_response); the recipe "
                   "reads prompt, chosen and rejected: rename yours with columns: when they are named otherwise")
# DPO types of earlier Axolotl releases that 0.19.0 stops on, and the strategy that reads their rows.
FORMER_PREFERENCE_TYPES: dict[str, tuple[TextType, str]] = {
    "argilla": (TextType({"prompt": "instruction", "chosen": "chosen_response", "rejected": "rejected_response"}),
                "default"),
}
# KTO strategies (chatml.py and llama3.py); argilla_chat writes every earlier turn of a conversation, which
# format strings cannot: the recipe sends it through the chat template, reported (KTO_CHAT).
UNPAIRED_TYPES: dict[str, TextType] = {
    "argilla": TextType({"prompt": "instruction"}), "intel": TextType({"prompt": "question"}),
    "prompt_pairs": TextType(), "ultra": TextType(),
}
# Every type of Axolotl 0.19.0's preference strategies, by the loader `rl:` picks (dpo also serves ipo and simpo),
# as a report line names them.
AXOLOTL_TYPES: dict[str, dict[str, tuple[str, ...]]] = {
    "dpo": {"chatml": tuple(PREFERENCE_TYPES), "llama3": tuple(PREFERENCE_TYPES),
            "chat_template": ("default", "argilla_chat"), "zephyr": ("nectar",), "passthrough": ("default",)},
    "kto": {"chatml": (*UNPAIRED_TYPES, "argilla_chat"), "llama3": (*UNPAIRED_TYPES, "argilla_chat")},
    "orpo": {"chat_template": ("argilla",)},
}
CHAT_TEMPLATE_TEXT = (
    "Axolotl renders the chat template to text and hands TRL strings: TRL's tokenizer call puts a BOS before the "
    "prompt even where the template writes one (two BOS), and each answer ends where its text does, trailing "
    "whitespace stripped (ChatML: the newline after <|im_end|> is not trained), EOS added when it does not end "
    "with it; the recipe hands TRL the messages, which it tokenizes as the template writes them (one BOS, the "
    "whole answer turn). To train Axolotl's exact tokens, give the rows as the texts Axolotl writes (prompt, "
    "chosen and rejected strings)")
KTO_CHAT = ("Axolotl writes every turn of `completion` before its last as the prompt, as text in the type's "
            "markup (the `prompt` column unused), and the last reply as the completion; the recipe reads "
            "prompt/completion/label and sends messages through data.chat_template (refusing a completion whose "
            "earlier turns are not the prompt). To train as Axolotl does, give "
            "the rows as text: prompt (the earlier turns as Axolotl writes them) and completion (the reply and the "
            "end of turn)")
ORPO_PROMPT = ("Axolotl writes a `prompt` column's text as the user's turn; the recipe takes the turns from chosen "
               "and rejected and refuses a row whose prompt is not the user turn they start with")
ORPO_SYSTEM = ("Axolotl writes a `system` column's text as the first message; the recipe reads the messages of "
               "chosen and rejected: for rows with a system text, put a system message at the start of both")


def split_type(kind: str) -> tuple[str, str]:
    """(module, function) of a type as Axolotl's loader reads it: `chatml` is `chatml.default`."""
    module, _, function = kind.rpartition(".")
    return (module, function) if module else (kind, "default")


def axolotl_has(rl: str, kind: str) -> bool:
    """Whether Axolotl 0.19.0 has the string type `kind` for `rl` (dpo, kto, orpo)."""
    module, function = split_type(kind)
    return function in AXOLOTL_TYPES[rl].get(module, ())


def known_types(rl: str) -> str:
    """Axolotl's types for `rl`, for a report line: ``chatml.intel/icr/...``."""
    return ", ".join(f"{m}.{'/'.join(fs)}" for m, fs in AXOLOTL_TYPES[rl].items())


def text_spec(template: str, strategy: TextType, answers: tuple[str, ...]) -> dict[str, str]:
    """`datasets[].texts` of a text strategy in `template`'s markup."""
    marks = TEXT_TEMPLATES[template]
    texts = {"prompt": marks["user"].replace("{prompt}", strategy.prompt)}
    if strategy.system:
        texts["system"] = marks["system"]
    for name in answers:
        texts[name] = (strategy.answer % name) + marks["end"]
    return texts


def preference(conv: Conversion, entry: dict, spec: dict, where: str) -> set[str]:
    """A dataset entry of a DPO, IPO, SimPO/CPO or ORPO config: format `preference`. Returns the entry keys
    it handled."""
    spec["format"] = "preference"
    kind = entry.get("type")
    if isinstance(kind, dict):
        user_defined(conv, kind, spec, where, ("chosen", "rejected"))
        return set()
    kind = str(kind or "")
    if not kind:  # Axolotl takes the rows as they are
        return set()
    rl = "orpo" if conv.recipe["stage"] == "orpo" else "dpo"
    module, function = split_type(kind)
    if rl == "orpo" and (module, function) == ("chat_template", "argilla"):
        conv.map(f"{where}.type", "data.datasets (format: preference, messages: TRL renders them as Axolotl does)")
        conv.note(f"{where}.type", ORPO_PROMPT)
        conv.change(f"{where}.type", ORPO_SYSTEM)
        return _chat_keys(conv, entry, where)
    if rl == "orpo":
        conv.note(f"{where}.type", f"Axolotl 0.19.0's ORPO has the type chat_template.argilla only and stops on "
                                   f"'{kind}'; the recipe reads the rows as the DPO type '{kind}' does")
    if module in TEXT_TEMPLATES:
        return _text_type(conv, entry, spec, where, module, function, kind)
    if module == "chat_template" and function in ("default", "argilla_chat", "argilla"):
        if function == "argilla":
            conv.note(f"{where}.type", "Axolotl 0.19.0's DPO has no chat_template.argilla (ORPO's type) and stops on "
                                       "it; converted as chat_template.argilla_chat, which reads such rows")
        cols = {} if function != "default" else _field_columns(entry, {"field_messages": "prompt"}, "messages")
        cols.update(_field_columns(entry, {"field_chosen": "chosen", "field_rejected": "rejected"}))
        if cols:
            spec["columns"] = cols
        conv.map(f"{where}.type", "data.datasets (format: preference, messages rendered by data.chat_template)")
        conv.change(f"{where}.type", CHAT_TEMPLATE_TEXT)
        return _chat_keys(conv, entry, where) | {"field_messages", "field_chosen", "field_rejected"}
    if (module, function) == ("passthrough", "default"):
        conv.map(f"{where}.type", "data.datasets (format: preference, the rows as they are)")
        return set()
    if (module, function) == ("zephyr", "nectar"):
        spec["texts"] = {"prompt": "<|system|>\n</s>\n<|user|>\n{prompt}</s>\n<|assistant|>\n"}
        conv.note(f"{where}.type", "'zephyr.nectar' is not supported: Axolotl picks the answers from `answers` by "
                                   "rank (chosen: the one it sorts last, rejected: the one before it); the recipe "
                                   "reads chosen and rejected columns: add them (the prompt is written as Axolotl "
                                   "writes it)")
        return set()
    conv.note(f"{where}.type", f"'{kind}' is not one of Axolotl 0.19.0's DPO types ({known_types('dpo')}): Axolotl "
                               f"stops on it; the rows are read as prompt/chosen/rejected")
    return set()


def unpaired(conv: Conversion, entry: dict, spec: dict, where: str) -> None:
    """A dataset entry of a KTO config: format `unpaired` (prompt, completion, label)."""
    spec["format"] = "unpaired"
    kind = entry.get("type")
    if isinstance(kind, dict):
        user_defined(conv, kind, spec, where, ("completion",))
        return
    kind = str(kind or "")
    if not kind:
        return
    module, function = split_type(kind)
    strategy = UNPAIRED_TYPES.get(function)
    if module in TEXT_TEMPLATES and strategy is not None:
        if strategy.columns:
            spec["columns"] = dict(strategy.columns)
        spec["texts"] = text_spec(module, strategy, ("completion",))
        conv.map(f"{where}.type", f"data.datasets (format: unpaired, texts: Axolotl's {kind} texts)")
    elif axolotl_has("kto", kind):  # argilla_chat: a loop over the turns, which format strings cannot write
        conv.change(f"{where}.type", KTO_CHAT)
    else:
        conv.note(f"{where}.type", f"'{kind}' is not one of Axolotl 0.19.0's KTO types ({known_types('kto')}): "
                                   f"Axolotl stops on it; the rows are read as prompt/completion/label")


def user_defined(conv: Conversion, kind: dict, spec: dict, where: str, answers: tuple[str, ...]) -> None:
    """A `type:` mapping (Axolotl's user_defined strategy): `field_<column>` renames and the `*_format` texts."""
    columns = ("prompt", "system", *answers, *(("label",) if answers == ("completion",) else ()))
    cols = {c: str(kind[f"field_{c}"]) for c in columns if kind.get(f"field_{c}") and kind[f"field_{c}"] != c}
    prompt = str(kind.get("prompt_format") or "{prompt}")
    if "{system}" not in prompt:
        cols.pop("system", None)  # the column is read only by a prompt that writes it
    if cols:
        spec["columns"] = cols
    texts = {"prompt": prompt} if prompt != "{prompt}" else {}
    for name in answers:
        text = str(kind.get(f"{name}_format") or f"{{{name}}}")
        if text != f"{{{name}}}":
            texts[name] = text
    if texts:
        spec["texts"] = texts
    conv.map(f"{where}.type", "data.datasets (columns:, texts: the type's formats)")
    if answers == ("completion",) and "{system}" in prompt:
        conv.note(f"{where}.type", "Axolotl stops on a row whose system text is empty (its prompt_format then "
                                   "misses {system}); the recipe writes it with an empty system text")
    known = {f"field_{c}" for c in columns} | {"prompt_format", *(f"{a}_format" for a in answers)}
    for key in kind:
        if key not in known:
            conv.note(f"{where}.type.{key}", "not a key of Axolotl's user_defined type; not converted")


def _text_type(conv: Conversion, entry: dict, spec: dict, where: str, module: str, function: str, kind: str) -> set[str]:
    strategy = PREFERENCE_TYPES.get(function)
    former = FORMER_PREFERENCE_TYPES.get(function)
    if strategy is None and former is not None:
        strategy, instead = former
        conv.note(f"{where}.type", f"Axolotl 0.19.0 has no DPO type '{kind}' and stops on it; converted as "
                                   f"{module}.{instead}, which reads these rows")
    if strategy is None:
        conv.note(f"{where}.type", f"'{kind}' is not one of Axolotl 0.19.0's DPO types ({known_types('dpo')}): "
                                   f"Axolotl stops on it; the rows are read as prompt/chosen/rejected")
        return set()
    if function == "default":
        conv.note(f"{where}.type", DEFAULT_COLUMNS)
    if strategy.columns:
        spec["columns"] = dict(strategy.columns)
    spec["texts"] = text_spec(module, strategy, ("chosen", "rejected"))
    conv.map(f"{where}.type", f"data.datasets (format: preference, texts: Axolotl's {kind} texts)")
    return set()


def _field_columns(entry: dict, keys: dict[str, str], default: str | None = None) -> dict[str, str]:
    """`columns:` renames of an entry's field_* keys (field_messages defaults to `default`)."""
    out = {}
    for key, column in keys.items():
        source = entry.get(key) or default
        if source and source != column:
            out[column] = str(source)
    return out


def _chat_keys(conv: Conversion, entry: dict, where: str) -> set[str]:
    """The chat template keys of an entry whose rows go through the chat template."""
    for key in ("message_property_mappings", "roles"):
        if entry.get(key) is not None:
            conv.note(f"{where}.{key}", "recipeforge reads role/content (or from/value) messages with the "
                                        "standard roles; other keys must be renamed in the data")
    if entry.get("chat_template") is not None:
        chat_template_key(conv, entry["chat_template"], f"{where}.chat_template")
    if entry.get("chat_template_jinja") is not None:
        jinja_key(conv, entry["chat_template_jinja"], f"{where}.chat_template_jinja")
    return {"message_property_mappings", "roles", "chat_template", "chat_template_jinja"}
