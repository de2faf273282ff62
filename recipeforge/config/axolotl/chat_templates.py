"""Axolotl chat template keys (`chat_template`, `chat_template_jinja`, a DPO type's template prefix) as the recipe's
`data.chat_template`: the dataset conversion and the preference types' conversion both write them here."""

from __future__ import annotations

from typing import Any

# Axolotl chat template names with a recipeforge counterpart (data.chat_template).
CHAT_TEMPLATES = {"chatml": "chatml", "llama3": "llama3", "llama4": "llama4", "qwen_25": "qwen2.5", "qwen3": "qwen3",
                  "gemma3": "gemma3", "mistral_v2v3": "mistral_v3", "mistral_v3_tekken": "mistral_v3_tekken",
                  "phi_3": "phi3", "deepseek_v3": "deepseek_v3", "tokenizer_default": "tokenizer"}
INLINE_JINJA = ("an inline Jinja template has no counterpart: save it as a .jinja file and set "
                "data.chat_template to its path (relative to the recipe)")


def jinja_key(conv: Any, value: Any, key: str) -> None:
    """A Jinja template file becomes data.chat_template; an inline template cannot be carried."""
    text = str(value)
    if "\n" not in text and "{%" not in text and "{{" not in text and text.endswith((".jinja", ".jinja2", ".j2")):
        conv.put("data.chat_template", text, key)
        conv.note(key, "data.chat_template is read relative to the recipe file: keep the template next to it")
    else:
        conv.note(key, INLINE_JINJA)
        conv.change(key, "the rows go through data.chat_template, not this template: save it as a .jinja file and "
                         "set data.chat_template to its path")


def chat_template_key(conv: Any, name: Any, key: str) -> None:
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
    else:
        conv.note(key, f"'{name}' has no built-in counterpart ({', '.join(sorted(set(CHAT_TEMPLATES.values())))}); "
                       f"data.chat_template is `tokenizer`, the model tokenizer's template (or set it to a .jinja "
                       f"file)")
