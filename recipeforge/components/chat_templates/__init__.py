"""The chat-template library: named Jinja templates shipped with recipeforge, and `data.chat_template`.

`data.chat_template` is ``tokenizer`` (the model tokenizer's own template), a name from `TEMPLATES`
(or one of its `ALIASES`), or a path to a ``.jinja`` file, relative to the recipe file that sets it.

Every named template reproduces the token layout of its model family's official template, and
wraps each assistant reply and its turn-end token in ``{% generation %}`` ... ``{% endgeneration %}``:
that marks the trained tokens (`formats.chat_segments`). A template also names the special tokens
it writes literally; `vocab.prepare_tokenizer` adds the missing ones to the tokenizer, so each stays
one token. Pure Python: no transformers import (the recipe checks use the names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from recipeforge.errors import Location, RecipeError, did_you_mean

HERE = Path(__file__).resolve().parent
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class TemplateInfo:
    """A named template: its file, the special tokens it writes, and the token that ends a turn."""

    file: str
    special: tuple[str, ...] = ()          # written literally; added as special tokens when missing
    plain: tuple[str, ...] = ()            # written literally; added as ordinary tokens when missing
    eot: str | None = None                 # turn end; None: the tokenizer's EOS
    family: str = ""

    @property
    def text(self) -> str:
        return _read(str(HERE / self.file))


_DS = ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁outputs▁begin｜>",
       "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")

TEMPLATES: dict[str, TemplateInfo] = {
    "chatml": TemplateInfo("chatml.jinja", ("<|im_start|>", "<|im_end|>"), eot="<|im_end|>",
                           family="ChatML (OpenHermes, Qwen-style base models)"),
    "llama3": TemplateInfo("llama3.jinja", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                           eot="<|eot_id|>", family="Llama 3, 3.1, 3.3"),
    "llama4": TemplateInfo("llama4.jinja", ("<|header_start|>", "<|header_end|>", "<|eot|>"), eot="<|eot|>",
                           family="Llama 4"),
    "qwen2.5": TemplateInfo("qwen2_5.jinja", ("<|im_start|>", "<|im_end|>"), eot="<|im_end|>", family="Qwen2.5"),
    "qwen3": TemplateInfo("qwen3.jinja", ("<|im_start|>", "<|im_end|>"), plain=("<think>", "</think>"),
                          eot="<|im_end|>", family="Qwen3"),
    "gemma3": TemplateInfo("gemma3.jinja", ("<start_of_turn>", "<end_of_turn>"), eot="<end_of_turn>",
                           family="Gemma 3"),
    "mistral_v3": TemplateInfo("mistral_v3.jinja", ("[INST]", "[/INST]"),
                               family="Mistral v3 (Mistral-7B-Instruct-v0.3)"),
    "mistral_v3_tekken": TemplateInfo("mistral_v3_tekken.jinja", ("[INST]", "[/INST]"),
                                      family="Mistral v3 Tekken (Mistral-Nemo)"),
    "phi3": TemplateInfo("phi3.jinja", ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"), eot="<|end|>",
                         family="Phi-3, Phi-3.5"),
    "deepseek_v3": TemplateInfo("deepseek_v3.jinja", _DS, eot="<｜end▁of▁sentence｜>", family="DeepSeek-V3"),
    "zephyr": TemplateInfo("zephyr.jinja", family="Zephyr"),
}
# Other spellings (Axolotl's among them) of the same templates.
ALIASES: dict[str, str] = {"qwen_25": "qwen2.5", "qwen2_5": "qwen2.5", "phi_3": "phi3", "deepseekv3": "deepseek_v3",
                           "mistral_v2v3": "mistral_v3", "llama3_1": "llama3", "llama3.1": "llama3"}
TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2")


@lru_cache(maxsize=None)
def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def canonical(name: str) -> str | None:
    """The library name `name` stands for, or None when it is not one."""
    if name in TEMPLATES:
        return name
    return ALIASES.get(name)


def is_template_path(value: str) -> bool:
    """Whether `data.chat_template` names a file rather than a built-in template."""
    return value.endswith(TEMPLATE_SUFFIXES) or "/" in value or "\\" in value


def known_names() -> list[str]:
    """What `data.chat_template` accepts by name (for error messages)."""
    return ["tokenizer", *TEMPLATES]


def unknown_name_error(value: str, *, location: Location | None = None, key: str = "data.chat_template"):
    """The error for a name that is neither ``tokenizer``, a library template nor a file path."""
    close = did_you_mean(value, [*known_names(), *ALIASES])
    return RecipeError(f"unknown chat template '{value}'", key=key, location=location,
                       hint=f"{close + ' ' if close else ''}available: {', '.join(known_names())}, or a path to "
                            f"a .jinja file")


@dataclass(frozen=True)
class ResolvedTemplate:
    """What `data.chat_template` resolved to: the Jinja text and the tokens it needs."""

    name: str                    # library name, or the file path
    text: str
    special: tuple[str, ...] = ()
    plain: tuple[str, ...] = ()
    eot: str | None = None


def resolve(value: str, *, base_dir: Path | None = None, location: Location | None = None,
            key: str = "data.chat_template") -> ResolvedTemplate | None:
    """The template `value` names; None for ``tokenizer`` (keep the tokenizer's own).

    A file path is taken relative to the folder of the recipe file that wrote the key (`location`),
    then to `base_dir`, then to the working directory. A missing file or an unknown name is an error
    at `key`.
    """
    if value == "tokenizer":
        return None
    name = canonical(value)
    if name is not None:
        info = TEMPLATES[name]
        return ResolvedTemplate(name, info.text, info.special, info.plain, info.eot)
    if not is_template_path(value):
        raise unknown_name_error(value, location=location, key=key)
    found = template_file(value, base_dir=base_dir, location=location)
    if found is None:
        tried = [str(d / value) for d in _bases(base_dir, location)] or [str(Path(value).absolute())]
        raise RecipeError(f"chat template file '{value}' not found (looked at {' and '.join(dict.fromkeys(tried))})",
                          key=key, location=location,
                          hint="paths are relative to the recipe file's folder; or name a built-in template: "
                               + ", ".join(known_names()))
    try:
        text = found.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"cannot read chat template file '{found}': {exc}", key=key, location=location) from None
    if not text.strip():
        raise RecipeError(f"chat template file '{found}' is empty", key=key, location=location)
    return ResolvedTemplate(str(found), text)


def template_file(value: str, *, base_dir: Path | None = None, location: Location | None = None) -> Path | None:
    """The existing file a template path names, or None."""
    p = Path(value).expanduser()
    candidates = [p] if p.is_absolute() else [d / p for d in _bases(base_dir, location)]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    return None


def _bases(base_dir: Path | None, location: Location | None) -> list[Path]:
    out = []
    if location is not None and location.file and not location.file.startswith("<"):
        out.append(Path(location.file).resolve().parent)
    if base_dir is not None:
        out.append(Path(base_dir))
    out.append(Path.cwd())
    return list(dict.fromkeys(out))


def has_generation_blocks(text: str | None) -> bool:
    """Whether a template marks assistant output with ``{% generation %}`` (exact label masks)."""
    return bool(text) and bool(GENERATION_TAG.search(text))
