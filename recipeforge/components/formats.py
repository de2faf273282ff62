"""Data formats: how a row of each supported layout becomes training input.

Formats live in the `formats` registry (entry-point group ``recipeforge.formats``); the built-ins
register exactly as a plugin would (a plugin's entry point names a `Format`). A format names its
columns, the stages it feeds, and renders one row:

* ``lm`` formats (text, alpaca, messages, completion) give *segments*: pieces of text or token ids,
  each marked trained or not. SFT masks the untrained ones (labels -100).
* ``preference`` gives prompt/chosen/rejected for DPO; ``prompt`` gives the GRPO prompt plus any
  extra columns, which reach the reward functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

from recipeforge.errors import RecipeError
from recipeforge.registry import Registry

Segment = tuple[Union[str, list], bool]  # (text or token ids, trained)


@dataclass(frozen=True)
class RenderOptions:
    """What rendering needs besides the row: the tokenizer and the masking choice."""

    tokenizer: Any
    train_on_inputs: bool = False
    prefix_ids: tuple[int, ...] = ()   # tokens the tokenizer puts before plain text (BOS)
    eos_token: str | None = None


@dataclass(frozen=True)
class Format:
    """A row layout: its columns, what it produces, and how one row is rendered."""

    name: str
    kind: str                                  # "lm" | "preference" | "prompt"
    required: tuple[str, ...]
    render: Callable[[dict, RenderOptions], Any]
    optional: tuple[str, ...] = ()
    conversational: Callable[[dict], bool] = field(default=lambda row: False)
    description: str = ""
    stages: tuple[str, ...] = ()               # stages that train on it; () = by kind (see `format_stages`)


# The stages each kind of format feeds; a format narrows or widens this with `Format.stages`.
KIND_STAGES: dict[str, tuple[str, ...]] = {"lm": ("sft",), "preference": ("dpo",), "prompt": ("grpo",)}


def format_stages(fmt: Format) -> tuple[str, ...]:
    """The stages that can train on `fmt`."""
    return fmt.stages or KIND_STAGES.get(fmt.kind, ())


def _as_format(name: str, obj: object) -> Format:
    if not isinstance(obj, Format):
        raise TypeError(f"a format must be a recipeforge.components.formats.Format, got {type(obj).__name__}")
    if obj.kind not in KIND_STAGES:
        raise TypeError(f"format '{name}' has kind '{obj.kind}'; kinds: {', '.join(KIND_STAGES)}")
    return obj


formats: Registry[Format] = Registry("formats", coerce=_as_format)

_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                 "user": "user", "assistant": "assistant", "system": "system", "tool": "tool"}


def normalize_messages(messages: Any, *, row: int | None = None, column: str = "messages") -> list[dict]:
    """OpenAI-style ``{role, content}`` messages from OpenAI or ShareGPT (``{from, value}``) rows."""
    if not isinstance(messages, list) or not messages:
        raise _row_error(row, f"column '{column}' must be a non-empty list of messages (got {type(messages).__name__})")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise _row_error(row, f"each message in '{column}' must be a mapping with role and content")
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        role_norm = _ROLE_ALIASES.get(str(role).lower()) if role is not None else None
        if role_norm is None:
            raise _row_error(row, f"message role '{role}' is not one of user, assistant, system, tool "
                                  f"(or ShareGPT human, gpt)")
        if not isinstance(content, str):
            raise _row_error(row, f"message content must be text (got {type(content).__name__})")
        out.append({"role": role_norm, "content": content})
    return out


def chat_segments(messages: list[dict], opts: RenderOptions) -> list[Segment]:
    """Segments of a conversation: assistant replies (with their end-of-turn) trained, the rest not.

    Rendering the conversation up to each assistant turn and taking differences keeps the exact text
    the template produces; it needs a prefix-consistent template, which is checked.
    """
    tok = opts.tokenizer
    segments: list[Segment] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
        full = tok.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            if opts.train_on_inputs:  # masking is not needed: train on the whole rendering
                return [(tok.apply_chat_template(messages, tokenize=False), True)]
            raise RecipeError("the chat template renders a conversation differently from its beginning, so "
                              "assistant tokens cannot be told apart", key="data.chat_template",
                              hint="use a named template (data.chat_template: chatml), or set "
                                   "data.train_on_inputs: true")
        if len(prompt) > len(done):
            segments.append((prompt[len(done):], opts.train_on_inputs))
        segments.append((full[len(prompt):], True))
        done = full
    return segments


def _text(row: dict, opts: RenderOptions) -> list[Segment]:
    text = row["text"]
    segs: list[Segment] = []
    if opts.prefix_ids:
        segs.append((list(opts.prefix_ids), True))
    segs.append((text, True))
    if opts.eos_token:
        segs.append((opts.eos_token, True))
    return segs


def _completion(row: dict, opts: RenderOptions) -> list[Segment]:
    segs: list[Segment] = []
    if opts.prefix_ids:
        segs.append((list(opts.prefix_ids), opts.train_on_inputs))
    segs.append((row["prompt"], opts.train_on_inputs))
    segs.append((row["completion"], True))
    if opts.eos_token:
        segs.append((opts.eos_token, True))
    return segs


def alpaca_messages(row: dict) -> list[dict]:
    """An alpaca row (instruction, optional input and system) as a user/assistant conversation."""
    user = row["instruction"]
    if row.get("input"):
        user = f"{user}\n\n{row['input']}"
    msgs = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    return msgs + [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]


def _alpaca(row: dict, opts: RenderOptions) -> list[Segment]:
    return chat_segments(alpaca_messages(row), opts)


def _messages(row: dict, opts: RenderOptions) -> list[Segment]:
    return chat_segments(normalize_messages(row["messages"]), opts)


def _is_conv(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _preference(row: dict, opts: RenderOptions) -> dict:
    prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
    if _is_conv(prompt) or _is_conv(chosen):
        def conv(value, name):
            if isinstance(value, str):
                return [{"role": "assistant", "content": value}] if name != "prompt" else \
                    [{"role": "user", "content": value}]
            return normalize_messages(value, column=name)
        out = {"chosen": conv(chosen, "chosen"), "rejected": conv(rejected, "rejected")}
        if prompt is not None:
            out["prompt"] = conv(prompt, "prompt")
        return out
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _prompt(row: dict, opts: RenderOptions) -> dict:
    prompt = row["prompt"]
    return {**row, "prompt": normalize_messages(prompt, column="prompt") if _is_conv(prompt) else prompt}


def _register_builtins() -> None:
    conv_pref = lambda row: _is_conv(row.get("chosen")) or _is_conv(row.get("prompt"))  # noqa: E731
    # Registration order is the order recipe errors list them in.
    for fmt in (
        Format("text", "lm", ("text",), _text, stages=("pretrain", "sft"),
               description="raw text; every token is trained"),
        Format("alpaca", "lm", ("instruction", "output"), _alpaca, optional=("input", "system"),
               conversational=lambda row: True,
               description="instruction/input/output through the chat template; loss on the output"),
        Format("messages", "lm", ("messages",), _messages, conversational=lambda row: True,
               description="chat messages (OpenAI roles or ShareGPT from/value); loss on assistant turns"),
        Format("completion", "lm", ("prompt", "completion"), _completion,
               description="prompt/completion pair; loss on the completion"),
        Format("preference", "preference", ("chosen", "rejected"), _preference, optional=("prompt",),
               conversational=conv_pref, description="prompt/chosen/rejected for DPO"),
        Format("prompt", "prompt", ("prompt",), _prompt, conversational=lambda row: _is_conv(row.get("prompt")),
               description="GRPO prompts; other columns are passed to the reward functions"),
    ):
        formats.register(fmt.name, fmt)


def get_format(name: str, *, key: str | None = None, location=None) -> Format:
    """The format called `name` (built-in or plugin); unknown names list the available ones."""
    return formats.get(name, key=key, location=location)


def _row_error(row: int | None, message: str) -> RecipeError:
    return RecipeError(f"row {row}: {message}" if row is not None else message)


_register_builtins()
