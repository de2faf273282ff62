"""SFT label masks from ``{% generation %}`` blocks: which tokens of a rendered conversation are trained.

The conversation is rendered once with transformers' Jinja renderer, which reports the character
span of every ``{% generation %}`` block (one per assistant reply). The whole text is tokenized at
once, as the model sees it at inference, and a token is trained when it overlaps a trained span.
Tokenizers without offsets (slow ones) get the text cut at the span edges instead.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Protocol

from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class MaskOptions(Protocol):
    """What masking reads of `formats.RenderOptions` (which imports this module)."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase: ...
    @property
    def train_on_inputs(self) -> bool: ...

Segment = tuple  # (text or token ids, trained), as in `formats`


def template_of(tokenizer) -> str | None:
    """The chat template text the tokenizer renders with (None when it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def render_with_spans(tokenizer, messages: list[dict], template: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its generation blocks, in order."""
    from jinja2.exceptions import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, spans = render_jinja_template(conversations=[messages], chat_template=template,
                                                return_assistant_tokens_mask=True,
                                                **dict(tokenizer.special_tokens_map))
    except TemplateError as exc:
        raise RecipeError(f"the chat template cannot render this conversation: {exc}", key="data.chat_template",
                          hint="check the message roles and their order for this template") from None
    return rendered[0], [tuple(s) for s in spans[0]]


def generation_segments(messages: list[dict], opts: MaskOptions, template: str) -> list[Segment]:
    """Segments of a conversation rendered through a template with generation blocks.

    Each reply's ``train`` flag (default true) decides whether its span is trained; with
    `opts.train_on_inputs` every token is.
    """
    tok = opts.tokenizer
    text, trained = trained_spans(tok, messages, template, train_on_inputs=opts.train_on_inputs)
    if trained is None:
        return [(text, True)]
    if not getattr(tok, "is_fast", False):
        return _cut_text(text, trained)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    segments: list[Segment] = []
    k = 0
    for token, (start, end) in zip(enc["input_ids"], enc["offset_mapping"]):
        while k < len(trained) and trained[k][1] <= start:
            k += 1
        # A token is trained when its characters overlap a trained span (a token that starts before
        # a reply, e.g. " Hello" after "[/INST]", belongs to the reply).
        on = k < len(trained) and start < trained[k][1] and max(end, start + 1) > trained[k][0]
        if segments and segments[-1][1] == on:
            segments[-1][0].append(token)
        else:
            segments.append(([token], on))
    return segments


def trained_spans(tokenizer, messages: list[dict], template: str, *, train_on_inputs: bool = False
                  ) -> tuple[str, list[tuple[int, int]] | None]:
    """The rendered conversation and the character spans of its trained replies (non-empty, in order);
    None for the spans when every token is trained (`train_on_inputs`)."""
    text, spans = render_with_spans(tokenizer, without_flags(messages), template)
    return text, select_spans(messages, spans, train_on_inputs=train_on_inputs)


def without_flags(messages: list[dict]) -> list[dict]:
    """The messages as the template sees them (no `train` keys)."""
    return [{k: v for k, v in m.items() if k != "train"} for m in messages]


def select_spans(messages: list[dict], spans: list, *, train_on_inputs: bool = False) -> list[tuple[int, int]] | None:
    """The trained ones of a rendering's generation spans (see `trained_spans`)."""
    if train_on_inputs:
        return None
    flags = _span_flags(messages, spans)
    return [span for span, keep in zip(spans, flags) if keep and span[1] > span[0]]


def render_many(tokenizer, conversations: list[list[dict]], template: str) -> list[tuple[str, list]]:
    """`render_with_spans` of many conversations in one call (the template variables are prepared once).
    Raises `jinja2` errors as they come: callers render row by row to say which row failed."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, spans = render_jinja_template(conversations=conversations, chat_template=template,
                                            return_assistant_tokens_mask=True, **dict(tokenizer.special_tokens_map))
    return [(text, [tuple(s) for s in row]) for text, row in zip(rendered, spans)]


def span_token_ranges(encoding, spans: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """Token index ranges ``[a, b)`` of an encoded rendering (a `tokenizers.Encoding`) that overlap the trained
    character `spans`: the tokens `generation_segments` trains, found by bisecting the token offsets (which
    rise along the text) instead of reading them all. None when a token has no character offsets."""
    n = len(encoding)
    chars = encoding.token_to_chars
    try:
        out = []
        for lo, hi in spans:
            # First token whose characters (at least one) reach past the span start; first token starting at or
            # after its end.
            a = bisect.bisect_right(range(n), lo, key=lambda i: max(chars(i)[1], chars(i)[0] + 1))
            b = bisect.bisect_left(range(n), hi, key=lambda i: chars(i)[0])
            # Bisecting assumes offsets rise along the text; the tokens at both edges are checked, and a
            # tokenizer whose offsets do not rise there is marked token by token instead (None).
            if (a > 0 and max(chars(a - 1)[1], chars(a - 1)[0] + 1) > lo) or (a < n and chars(a)[1] <= lo
                                                                               and chars(a)[0] + 1 <= lo) \
                    or (b > 0 and chars(b - 1)[0] >= hi) or (b < n and chars(b)[0] < hi):
                return None
            if a < b:
                out.append((a, b))
        return out
    except TypeError:  # token_to_chars gave None
        return None


def _span_flags(messages: list[dict], spans: list) -> list[bool]:
    """Whether each generation span is trained: the `train` flag of the assistant reply it renders."""
    replies = [m for m in messages if m["role"] == "assistant"]
    check_train_flags(messages)
    if not any("train" in m for m in messages):
        return [True] * len(spans)
    if len(spans) != len(replies):
        raise RecipeError(f"the chat template marks {len(spans)} replies for {len(replies)} assistant messages, so "
                          f"per-message train flags cannot be matched to them", key="data.chat_template",
                          hint="use a template with one {% generation %} block per assistant message")
    return [m.get("train") is not False for m in replies]


def check_train_flags(messages: list[dict]) -> None:
    """Only assistant replies can be marked to be trained (a flag on other messages is refused)."""
    for n, m in enumerate(messages, start=1):
        if m.get("train") is True and m["role"] != "assistant":
            raise RecipeError(f"message {n} ({m['role']}) is marked to be trained; per-message training applies "
                              f"to assistant replies (messages.train_field)",
                              hint="mark only assistant messages, or set data.train_on_inputs: true to train on "
                                   "every token")


def _cut_text(text: str, trained: list) -> list[Segment]:
    segments: list[Segment] = []
    pos = 0
    for start, end in trained:
        if start > pos:
            segments.append((text[pos:start], False))
        segments.append((text[start:end], True))
        pos = end
    if pos < len(text):
        segments.append((text[pos:], False))
    return segments
