"""The OpenAI API's request and response shapes that `recipeforge serve` speaks (no model, no torch).

Requests are read into a `Request` (what to generate, how), with a `BadRequest` naming the field at
fault; responses and stream chunks are built as the OpenAI reference gives them, so the official
clients read them unchanged: ``chat.completion`` / ``chat.completion.chunk`` for
``/v1/chat/completions``, ``text_completion`` for ``/v1/completions`` and a ``list`` of ``model``
for ``/v1/models``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_TOKENS = 256


class BadRequest(Exception):
    """A request the server cannot answer: HTTP `status`, the OpenAI error `kind` and the field at fault."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code

    def body(self) -> dict[str, Any]:
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Request:
    """One generation request: chat `messages` or a completion `prompt`, and its sampling."""

    model: str
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_given: bool = False  # the client set it: past the context it is a 400, not shortened
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


def parse_request(body: Any, *, chat: bool, served: str) -> Request:
    """A `Request` from a decoded JSON body (`chat`: /v1/chat/completions, else /v1/completions); a
    `BadRequest` for a malformed field, or for a model other than the one `served`."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _check_text(body, "")
    model = body.get("model")
    if not isinstance(model, str):
        raise BadRequest("model must be a string: the served model's name", param="model")
    if model != served:
        raise BadRequest(f"the model {model[:100]!r} does not exist; this server serves {served!r}", param="model",
                         status=404, code="model_not_found")
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise BadRequest("only n=1 is served (ask several times, or serve with --engine vllm)", param="n")
    inputs = {"messages": _messages(body.get("messages"))} if chat else {"prompt": _prompt(body.get("prompt"))}
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    max_tokens = _max_tokens(body)
    min_tokens = body.get("min_tokens", 0)  # vLLM's extension: no end of text before this many tokens
    if min_tokens is None:
        min_tokens = 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or not 0 <= min_tokens <= max_tokens:
        raise BadRequest("min_tokens must be an integer from 0 to max_tokens", param="min_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream must be true or false", param="stream")
    return Request(model=model, **inputs, max_tokens=max_tokens, min_tokens=min_tokens, stream=bool(stream),
                   max_tokens_given=body.get("max_completion_tokens", body.get("max_tokens")) is not None,
                   temperature=_number(body, "temperature", 1.0, low=0.0, high=2.0),
                   top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0), stop=_stop(body.get("stop")),
                   include_usage=bool(isinstance(options, dict) and options.get("include_usage")))


def _check_text(value: Any, where: str, depth: int = 0) -> None:
    """Refuse strings a tokenizer cannot encode (lone surrogates from ``\\ud800`` escapes) anywhere in the
    body, with the field they stand in."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{where or 'the body'} holds a lone surrogate (\\ud800-\\udfff): not text",
                             param=where or None) from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(v, f"{where}.{k}" if where else str(k), depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_text(v, f"{where}[{i}]", depth + 1)


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}] needs a role of system, user or assistant", param=f"messages[{i}]")
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: the text ones, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        out.append({"role": message["role"], "content": content})
    return out


def _prompt(raw: Any) -> str:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if not isinstance(raw, str):
        raise BadRequest("prompt must be a string (one prompt per request)", param="prompt")
    return raw


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("max_tokens must be a positive integer", param="max_tokens")
    return value


def context_exceeded(*, context: int, prompt_tokens: int, max_tokens: int, given: bool, chat: bool) -> str | None:
    """Why a request does not fit the model's context of `context` tokens (None when it does), in the
    words OpenAI-compatible servers use: the prompt alone, or the prompt plus `max_tokens` when the
    client asked for that many (a default is shortened to what fits instead)."""
    what = "messages" if chat else "prompt"
    if prompt_tokens >= context:
        return (f"This model's maximum context length is {context} tokens. However, your {what} resulted in "
                f"{prompt_tokens} tokens. Please reduce the length of the {what}.")
    if given and prompt_tokens + max_tokens > context:
        return (f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, {max_tokens} in the "
                f"completion). Please reduce the length of the {what} or completion.")
    return None


def _number(body: dict[str, Any], key: str, default: float, *, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"{key} must be a number from {low:g} to {high:g}", param=key)
    return float(value)


def _stop(raw: Any) -> list[str]:
    stops = [raw] if isinstance(raw, str) else raw if raw is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise BadRequest("stop must be a string or a list of up to 4 non-empty strings", param="stop")
    return stops


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the first stop string (excluded, as OpenAI does), and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[:min(cuts)], True) if cuts else (text, False)


def new_id(request: Request) -> str:
    return ("chatcmpl-" if request.is_chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(request: Request, rid: str, text: str, finish_reason: str, tokens: tuple[int, int]) -> dict[str, Any]:
    """The whole answer to a non-streamed request (`tokens`: prompt and completion token counts)."""
    if request.is_chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return {"id": rid, "object": "chat.completion" if request.is_chat else "text_completion",
            "created": int(time.time()), "model": request.model, "choices": [choice], "usage": usage(*tokens)}


def chunk(request: Request, rid: str, *, text: str | None = None, finish_reason: str | None = None,
          first: bool = False) -> dict[str, Any]:
    """One streamed piece: the role first (chat), then text, then an empty piece with the finish reason."""
    if request.is_chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": None}
    return {"id": rid, "object": "chat.completion.chunk" if request.is_chat else "text_completion",
            "created": int(time.time()), "model": request.model, "choices": [choice]}


def usage_chunk(request: Request, rid: str, tokens: tuple[int, int]) -> dict[str, Any]:
    """The last streamed piece when the client asked for usage (`stream_options.include_usage`)."""
    return {"id": rid, "object": "chat.completion.chunk" if request.is_chat else "text_completion",
            "created": int(time.time()), "model": request.model, "choices": [], "usage": usage(*tokens)}


def models_list(served: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": served, "object": "model", "created": created,
                                        "owned_by": "recipeforge"}]}
