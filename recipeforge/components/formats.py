"""Data formats: how a row of each supported layout becomes training input.

Formats live in the `formats` registry (entry-point group ``recipeforge.formats``); the built-ins
register exactly as a plugin would (a plugin's entry point names a `Format`). A format names its
columns, the stages it feeds, and renders one row:

* ``lm`` formats (text, alpaca, messages, completion) give *segments*: pieces of text or token ids,
  each marked trained or not. SFT masks the untrained ones (labels -100).
* ``preference`` gives prompt/chosen/rejected for DPO; ``prompt`` gives the GRPO prompt plus any
  extra columns, which reach the reward functions.
* ``unpaired`` gives prompt/completion/label (label true: desirable) for KTO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Union

from recipeforge.components.chat_templates import GENERATION_TAG
from recipeforge.errors import RecipeError
from recipeforge.registry import Registry
from recipeforge.stage_specs import FORMAT_KINDS, STAGE_SPECS, stage_spec, stages_for_format_kind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Segment = tuple[Union[str, list], bool]  # (text or token ids, trained)


@dataclass(frozen=True)
class RenderOptions:
    """What rendering needs besides the row: the tokenizer and the masking choice."""

    tokenizer: PreTrainedTokenizerBase
    train_on_inputs: bool = False
    prefix_ids: tuple[int, ...] = ()   # tokens the tokenizer puts before plain text (BOS)
    eos_token: str | None = None
    eot_tokens: tuple[str, ...] = ()   # tokens that end a turn besides EOS (`model.eot_tokens`)


@dataclass(frozen=True)
class Format:
    """A row layout: its columns, what it produces, and how one row is rendered."""

    name: str
    kind: str                                  # "lm" | "preference" | "prompt" | "unpaired"
    required: tuple[str, ...]
    render: Callable[[dict, RenderOptions], Any]
    optional: tuple[str, ...] = ()
    conversational: Callable[[dict], bool] = field(default=lambda row: False)
    description: str = ""
    stages: tuple[str, ...] = ()               # stages that train on it; () = by kind (see `format_stages`)
    # For chat formats whose `render` is `chat_segments(to_messages(row), opts)`: the row's messages, so that
    # whole batches can be rendered and tokenized at once (`lm_encode`) with the same result.
    to_messages: Callable[[dict], list[dict]] | None = None


# The stages each kind of format feeds (each stage's spec names its kinds); a format narrows or widens
# this with `Format.stages`.
KIND_STAGES: dict[str, tuple[str, ...]] = {kind: stages_for_format_kind(kind) for kind in FORMAT_KINDS}


def format_stages(fmt: Format) -> tuple[str, ...]:
    """The built-in stages that can train on `fmt`."""
    return fmt.stages or KIND_STAGES.get(fmt.kind, ())


def trains_on(stage: str, fmt: Format) -> bool:
    """Whether `stage` can train on `fmt`: a built-in stage by `format_stages`, a plugin's stage by the
    kinds its spec names (`StageSpec.format_kinds`)."""
    if stage in STAGE_SPECS:
        return stage in format_stages(fmt)
    return fmt.kind in stage_spec(stage).format_kinds


def _as_format(name: str, obj: object) -> Format:
    if not isinstance(obj, Format):
        raise TypeError(f"a format must be a recipeforge.components.formats.Format, got {type(obj).__name__}")
    if obj.kind not in KIND_STAGES:
        raise TypeError(f"format '{name}' has kind '{obj.kind}'; kinds: {', '.join(KIND_STAGES)}")
    return obj


formats: Registry[Format] = Registry("formats", coerce=_as_format)

_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                 "user": "user", "assistant": "assistant", "system": "system", "tool": "tool"}


def normalize_messages(messages: object, *, row: int | None = None, column: str = "messages") -> list[dict]:
    """OpenAI-style ``{role, content}`` messages from OpenAI or ShareGPT (``{from, value}``) rows.

    A boolean ``train`` key (written by `data.datasets[].messages.train_field`) is kept: it says
    whether an assistant reply is trained. An assistant's ``tool_calls`` and a tool result's ``name``
    and ``tool_call_id`` are kept for the chat template, which writes them as the server does (an
    assistant turn that only calls tools may have no content)."""
    if not isinstance(messages, list) or not messages:
        raise _row_error(row, f"column '{column}' must be a non-empty list of messages (got {type(messages).__name__})")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise _row_error(row, f"each message in '{column}' must be a mapping with role and content")
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        calls = m.get("tool_calls")
        if content is None and isinstance(calls, list) and calls:
            content = ""
        role_norm = _ROLE_ALIASES.get(str(role).lower()) if role is not None else None
        if role_norm is None:
            raise _row_error(row, f"message role '{role}' is not one of user, assistant, system, tool "
                                  f"(or ShareGPT human, gpt)")
        if not isinstance(content, str):
            raise _row_error(row, f"message content must be text (got {type(content).__name__})")
        msg = {"role": role_norm, "content": content}
        if isinstance(m.get("train"), bool):
            msg["train"] = m["train"]
        if isinstance(calls, list) and calls and role_norm == "assistant":
            msg["tool_calls"] = calls
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str) and role_norm == "tool":
                msg[key] = m[key]
        out.append(msg)
    return out


def chat_segments(messages: list[dict], opts: RenderOptions) -> list[Segment]:
    """Segments of a conversation: assistant replies (with their end-of-turn) trained, the rest not.

    A template that marks replies with ``{% generation %}`` (every named template does) is rendered
    once and tokenized whole, and the tokens inside the marked spans are trained (`chat_masks`).
    Other templates are rendered up to each assistant turn and the differences taken; that needs a
    prefix-consistent template, which is checked. A message with ``train: false`` is not trained.
    """
    from recipeforge.components.chat_masks import generation_segments, template_of

    template = template_of(opts.tokenizer)
    if template is not None and GENERATION_TAG.search(template):
        return generation_segments(messages, opts, template)
    return _prefix_segments(messages, opts)


def _prefix_segments(messages: list[dict], opts: RenderOptions) -> list[Segment]:
    from recipeforge.components.chat_masks import check_train_flags

    tok = opts.tokenizer
    check_train_flags(messages)
    eots = tuple(t for t in (*opts.eot_tokens, opts.eos_token or getattr(tok, "eos_token", None)) if t)
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
                              hint="use a named template (data.chat_template: chatml), mark the replies with "
                                   "{% generation %}, or set data.train_on_inputs: true")
        if len(prompt) > len(done):
            segments.append((prompt[len(done):], opts.train_on_inputs))
        trained = opts.train_on_inputs or m.get("train") is not False
        reply, after = split_after_turn_end(full[len(prompt):], eots)
        segments.append((reply, trained))
        if after:  # e.g. the newline after <|im_end|>: the model never writes it
            segments.append((after, opts.train_on_inputs))
        done = full
    return segments


def split_after_turn_end(reply: str, eots: tuple[str, ...]) -> tuple[str, str]:
    """A rendered reply cut after its last turn-end token, when only whitespace follows it."""
    cut = max((reply.rfind(t) + len(t) for t in eots if t in reply), default=-1)
    if cut <= 0 or reply[cut:].strip():
        return reply, ""
    return reply[:cut], reply[cut:]


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
    if opts.eos_token and not row["completion"].endswith(opts.eos_token):  # one EOS, as Axolotl's prompters do
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


def _segments(row: dict, opts: RenderOptions) -> list[Segment]:
    """Pieces of text with a train label each (Axolotl's `input_output` rows: ``segments: [{text, label}]``),
    each tokenized apart and nothing added: no BOS, no EOS, no template."""
    pieces = row["segments"]
    if not isinstance(pieces, list) or not pieces:
        raise RecipeError(f"column 'segments' must be a non-empty list of {{text, label}} (got {type(pieces).__name__})")
    out: list[Segment] = []
    for n, piece in enumerate(pieces, start=1):
        if not isinstance(piece, dict) or not isinstance(piece.get("text"), str):
            raise RecipeError(f"segment {n} must be a mapping with a `text` string and a `label` (true: trained)")
        label = piece.get("label", True)
        if not isinstance(label, bool):
            raise RecipeError(f"segment {n}: `label` must be true (trained) or false, got {label!r}")
        if piece["text"]:
            out.append((piece["text"], label or opts.train_on_inputs))
    return out


def _tokenized(row: dict, opts: RenderOptions) -> list[Segment]:
    """Token ids as they are: trained where `labels` equals the id (all, without labels), not where it is -100;
    positions with attention_mask 0 (padding in pre-padded rows) are left out."""
    ids = row["input_ids"]
    labels, mask = row.get("labels"), row.get("attention_mask")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RecipeError("column 'input_ids' must be a list of whole numbers")
    for name, col in (("labels", labels), ("attention_mask", mask)):
        if col is not None and len(col) != len(ids):
            raise RecipeError(f"column '{name}' has {len(col)} values but input_ids has {len(ids)}",
                              hint="every position of input_ids needs one label / mask value")
    vocab = len(opts.tokenizer)
    for j, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise RecipeError(f"input_ids[{j}] = {t} is outside the vocabulary (0 to {vocab - 1})",
                              hint="the rows were tokenized with another tokenizer; set model.tokenizer to it")
    segments: list[Segment] = []
    for j, t in enumerate(ids):
        if mask is not None and not mask[j]:
            continue
        lab = t if labels is None else labels[j]
        if lab not in (t, -100):
            raise RecipeError(f"labels[{j}] = {lab} is neither input_ids[{j}] ({t}) nor -100",
                              hint="labels are not shifted: each is its position's token id, or -100 for "
                                   "positions without loss")
        trained = lab != -100  # labels given are kept as they are, whatever train_on_inputs says
        if segments and segments[-1][1] == trained:
            segments[-1][0].append(t)
        else:
            segments.append(([t], trained))
    return segments


def row_messages(row: dict) -> list[dict]:
    """The messages of a `messages` row, normalized."""
    return normalize_messages(row["messages"])


def _messages(row: dict, opts: RenderOptions) -> list[Segment]:
    return chat_segments(row_messages(row), opts)


def _is_conv(value: object) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _as_messages(value: object, column: str, role: str) -> list[dict]:
    """A column of a conversational row as messages: text is one message of `role`, a mapping one message."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return normalize_messages([value] if isinstance(value, dict) else value, column=column)


def _reply_only(messages: list[dict], prompt: list[dict] | None, column: str) -> list[dict]:
    """An answer that holds the whole exchange (the layout of argilla's datasets, whose `chosen` and `rejected`
    start with the user's turn) beside a prompt: its last message, when the turns before it are the prompt's
    last turns; the prompt would otherwise be sent twice."""
    if prompt is None or len(messages) < 2 or messages[0]["role"] not in ("system", "user"):
        return messages  # the reply alone (or replies and tool turns that continue the prompt)
    head = messages[:-1]
    if prompt[-len(head):] != head:
        raise RecipeError(f"column '{column}' holds turns before its reply that are not the prompt's; give "
                          f"'{column}' the reply alone, or leave the prompt out")
    return messages[-1:]


def _preference(row: dict, opts: RenderOptions) -> dict:
    prompt, chosen, rejected = row.get("prompt"), row["chosen"], row["rejected"]
    if _is_conv(prompt) or _is_conv(chosen) or isinstance(chosen, dict):
        turns = None if prompt is None else _as_messages(prompt, "prompt", "user")
        out = {name: _reply_only(_as_messages(value, name, "assistant"), turns, name)
               for name, value in (("chosen", chosen), ("rejected", rejected))}
        if turns is not None:
            out["prompt"] = turns
        return out
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def _unpaired(row: dict, opts: RenderOptions) -> dict:
    label = row["label"]
    if not isinstance(label, bool):  # 0/1 or "yes" would silently become truthy
        raise RecipeError(f"column 'label' must be true (desirable) or false (undesirable), got {label!r}")
    prompt, completion = row["prompt"], row["completion"]
    if _is_conv(prompt) or _is_conv(completion) or isinstance(completion, dict):
        prompt = _as_messages(prompt, "prompt", "user")
        completion = _reply_only(_as_messages(completion, "completion", "assistant"), prompt, "completion")
    return {"prompt": prompt, "completion": completion, "label": label}


def _prompt(row: dict, opts: RenderOptions) -> dict:
    prompt = row["prompt"]
    return {**row, "prompt": normalize_messages(prompt, column="prompt") if _is_conv(prompt) else prompt}


def _register_builtins() -> None:
    conv_pref = lambda row: (_is_conv(row.get("chosen")) or _is_conv(row.get("prompt"))  # noqa: E731
                             or isinstance(row.get("chosen"), dict))
    # Registration order is the order recipe errors list them in.
    for fmt in (
        Format("text", "lm", ("text",), _text, stages=("pretrain", "sft", "distill"),
               description="raw text; every token is trained"),
        Format("alpaca", "lm", ("instruction", "output"), _alpaca, optional=("input", "system"),
               conversational=lambda row: True, to_messages=alpaca_messages,
               description="instruction/input/output through the chat template (or the dataset's text `prompt`); "
                           "loss on the output"),
        Format("messages", "lm", ("messages",), _messages, conversational=lambda row: True, to_messages=row_messages,
               description="chat messages (OpenAI roles or ShareGPT from/value); loss on assistant turns"),
        Format("completion", "lm", ("prompt", "completion"), _completion,
               description="prompt/completion pair; loss on the completion"),
        Format("segments", "lm", ("segments",), _segments,
               description="segments: [{text, label}] pieces of text, trained where label is true; tokenized "
                           "apart, with no BOS, EOS or template added (Axolotl's input_output)"),
        Format("tokenized", "lm", ("input_ids",), _tokenized, optional=("labels", "attention_mask"),
               stages=("pretrain", "sft", "distill"),
               description="pre-tokenized rows: input_ids (+ labels with -100 for no loss, attention_mask), "
                           "taken as they are"),
        # `margin`: a number per pair, for the reward stage's margin term (-log sigmoid(r_c - r_r - margin)).
        Format("preference", "preference", ("chosen", "rejected"), _preference, optional=("prompt", "margin"),
               conversational=conv_pref,
               description="prompt/chosen/rejected for DPO and the other preference stages; an optional "
                           "numeric margin column for reward models"),
        Format("unpaired", "unpaired", ("prompt", "completion", "label"), _unpaired,
               conversational=lambda row: _is_conv(row.get("prompt")) or _is_conv(row.get("completion")),
               description="prompt/completion/label (true: desirable) for KTO"),
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
