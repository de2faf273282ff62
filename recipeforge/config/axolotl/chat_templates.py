"""Axolotl chat template keys (`chat_template`, `chat_template_jinja`, a DPO type's template prefix) as the recipe's
`data.chat_template`: the dataset conversion and the preference types' conversion both write them here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recipeforge.json_value import JSONValue

if TYPE_CHECKING:
    from recipeforge.config.axolotl.conversion import Conversion

# Axolotl chat template names with a recipeforge counterpart (data.chat_template).
CHAT_TEMPLATES = {"chatml": "chatml", "llama3": "llama3", "llama4": "llama4", "qwen_25": "qwen2.5", "qwen3": "qwen3",
                  "gemma3": "gemma3", "mistral_v2v3": "mistral_v3", "mistral_v3_tekken": "mistral_v3_tekken",
                  "phi_3": "phi3", "deepseek_v3": "deepseek_v3", "tokenizer_default": "tokenizer"}
# Where recipeforge's template of the same name writes or trains other tokens than Axolotl's (measured against
# Axolotl 0.19.0: tests/data/axolotl/fidelity/cases.json). The templates not listed write the same text and train
# the same tokens.
_SAVE_AXOLOTLS = ("to train Axolotl's exact text, save Axolotl's template as a .jinja file and set "
                  "data.chat_template to its path")


def _end_of_turn(token: str) -> str:
    return (f"recipeforge trains the template's end of turn {token} after each reply; Axolotl trains only the "
            f"tokenizer's EOS (its eot_tokens default) and warns that {token} goes untrained otherwise: the same "
            f"tokens when the model's EOS is {token}, as for its instruct tokenizers")


TEMPLATE_CHANGES: dict[str, str] = {
    "chatml": "recipeforge's chatml starts each row with the tokenizer's BOS token when it has one (Qwen-style "
              f"tokenizers have none); Axolotl's writes no BOS: {_SAVE_AXOLOTLS}",
    "phi_3": "Axolotl's phi_3 starts with the BOS token and ends a conversation without EOS; recipeforge's phi3 "
             f"writes no BOS and ends a finished conversation with EOS; {_end_of_turn('<|end|>')}; {_SAVE_AXOLOTLS}",
    "llama3": _end_of_turn("<|eot_id|>"),
    "llama4": _end_of_turn("<|eot|>"),
    "gemma3": _end_of_turn("<end_of_turn>"),
    "deepseek_v3": _end_of_turn("<｜end▁of▁sentence｜>"),
    "mistral_v2v3": "Axolotl's mistral_v2v3 leaves the system message out of the row; recipeforge's mistral_v3 writes "
                    f"it before the first user message: {_SAVE_AXOLOTLS}, or drop the system messages from the data",
    "mistral_v3_tekken": "Axolotl's mistral_v3_tekken leaves the system message out of the row; recipeforge's writes "
                         f"it before the first user message: {_SAVE_AXOLOTLS}, or drop the system messages from the "
                         "data",
}

INLINE_JINJA = ("an inline Jinja template has no counterpart: save it as a .jinja file and set "
                "data.chat_template to its path (relative to the recipe)")


def jinja_key(conv: Conversion, value: JSONValue, key: str) -> None:
    """A Jinja template file becomes data.chat_template; an inline template cannot be carried."""
    text = str(value)
    if "\n" not in text and "{%" not in text and "{{" not in text and text.endswith((".jinja", ".jinja2", ".j2")):
        conv.put("data.chat_template", text, key)
        conv.note(key, "data.chat_template is read relative to the recipe file: keep the template next to it")
    else:
        conv.note(key, INLINE_JINJA)
        conv.change(key, "the rows go through data.chat_template, not this template: save it as a .jinja file and "
                         "set data.chat_template to its path")


def chat_template_key(conv: Conversion, name: JSONValue, key: str) -> None:
    """An Axolotl chat template name becomes data.chat_template where recipeforge has one by that name; another
    is reported, the tokenizer's own template kept."""
    name = str(name)
    if name == "jinja":  # the template is chat_template_jinja's
        conv.map(key, "data.chat_template")
        return
    if conv.vision is not None and name != "tokenizer_default":
        from recipeforge.config.axolotl.vision import chat_template_note

        current = conv.recipe.get("data", {}).get("chat_template")
        if current not in (None, "tokenizer"):  # a .jinja file of the user's own is kept
            conv.note(key, f"recipeforge has one chat template for all datasets; {current} is kept")
            return
        conv.put("data.chat_template", "tokenizer")
        conv.note(key, chat_template_note(name))
        return
    if name in CHAT_TEMPLATES:
        current = conv.recipe.get("data", {}).get("chat_template")
        if current is not None and current != CHAT_TEMPLATES[name]:
            conv.note(key, f"recipeforge has one chat template for all datasets; {current} is kept")
        else:
            conv.put("data.chat_template", CHAT_TEMPLATES[name], key)
            if name in TEMPLATE_CHANGES:
                conv.change(key, TEMPLATE_CHANGES[name])
    else:
        conv.note(key, f"'{name}' has no built-in counterpart ({', '.join(sorted(set(CHAT_TEMPLATES.values())))}); "
                       f"data.chat_template is `tokenizer`, the model tokenizer's template (or set it to a .jinja "
                       f"file)")
