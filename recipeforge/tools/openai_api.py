"""The OpenAI API's request and response shapes that `recipeforge serve` speaks (no model, no torch).

Requests are read into a `Request` (what to generate, how), with a `BadRequest` naming the field at
fault; responses and stream chunks are built as the OpenAI reference gives them, so the official
clients read them unchanged: ``chat.completion`` / ``chat.completion.chunk`` for
``/v1/chat/completions``, ``text_completion`` for ``/v1/completions`` and a ``list`` of ``model``
for ``/v1/models``. vLLM's extensions of ``/v1/completions`` are read as vLLM reads them: a prompt
given as token ids (one list, or a batch of lists) and ``prompt_logprobs`` (the prompt's log-probs,
answered per choice in vLLM's shape), and ``/tokenize`` (`parse_tokenize`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from recipeforge.json_value import JSONValue

DEFAULT_MAX_TOKENS = 256
MAX_PROMPTS = 64           # token-id prompts of one batched /v1/completions request
DEFAULT_MAX_LOGPROBS = 20  # the most `prompt_logprobs` a request may ask for, as vLLM's `max_logprobs`


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
    token_prompts: tuple[tuple[int, ...], ...] | None = None  # the prompt as token ids: one, or a batch
    prompt_logprobs: int | None = None  # vLLM's extension: the k most likely tokens at each prompt position
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

    @property
    def prompt_count(self) -> int:
        """Prompts answered, one choice each: a batch of token-id prompts, else one."""
        return len(self.token_prompts) if self.token_prompts is not None else 1


def _checked_body(body: JSONValue, served: str, *, model_required: bool = True) -> str:
    """The model a JSON object `body` names (`served` when it names none and need not); a `BadRequest`
    for a body that is not an object, holds lone surrogates or names a model this server does not serve."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        _check_text(body, "")
    except RecursionError:  # nested nearly as deep as the parser allows, and past what a walk of it can
        raise BadRequest("the request body is nested too deeply") from None
    model = body.get("model")
    if model is None and not model_required:
        return served
    if not isinstance(model, str):
        raise BadRequest("model must be a string: the served model's name", param="model")
    if model != served:
        raise BadRequest(f"the model {model[:100]!r} does not exist; this server serves {served!r}", param="model",
                         status=404, code="model_not_found")
    return model


def parse_request(body: JSONValue, *, chat: bool, served: str, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> Request:
    """A `Request` from a decoded JSON body (`chat`: /v1/chat/completions, else /v1/completions); a
    `BadRequest` for a malformed field, for a model other than the one `served`, or for more
    `prompt_logprobs` than `max_logprobs`."""
    model = _checked_body(body, served)
    n = body.get("n", 1)
    if n is not None and (isinstance(n, bool) or n != 1):
        raise BadRequest("only n=1 is served (ask several times, or serve with --engine vllm)", param="n")
    inputs: dict[str, Any] = {"messages": _messages(body.get("messages"))} if chat else _prompt(body.get("prompt"))
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
    logprobs = _prompt_logprobs(body.get("prompt_logprobs"), max_logprobs, chat=chat, stream=bool(stream))
    if stream and len(inputs.get("token_prompts") or ()) > 1:
        raise BadRequest("a batch of prompts is answered whole: send it without stream, or stream one prompt "
                         "per request", param="stream")
    return Request(model=model, **inputs, max_tokens=max_tokens, min_tokens=min_tokens, stream=bool(stream),
                   prompt_logprobs=logprobs,
                   max_tokens_given=body.get("max_completion_tokens", body.get("max_tokens")) is not None,
                   temperature=_number(body, "temperature", 1.0, low=0.0, high=2.0),
                   top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0), stop=_stop(body.get("stop")),
                   include_usage=bool(isinstance(options, dict) and options.get("include_usage")))


def _check_text(value: JSONValue, where: str, depth: int = 0) -> None:
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


def _messages(raw: JSONValue) -> list[dict[str, str]]:
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


def _prompt(raw: JSONValue) -> dict[str, Any]:
    """The completion prompt: text (`prompt`), or token ids (`token_prompts`): a list of ids, or a batch
    of up to `MAX_PROMPTS` such lists. Ids are checked against the vocabulary by the server, which knows it."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, str):
        return {"prompt": raw}
    shape = "prompt must be a string, a list of token ids, or a list of such lists (a batch)"
    if not isinstance(raw, list) or not raw:
        raise BadRequest(shape, param="prompt")
    batch = raw if all(isinstance(p, list) for p in raw) else [raw]
    if len(batch) > MAX_PROMPTS:
        raise BadRequest(f"prompt holds {len(batch)} prompts, more than this server answers in one request "
                         f"({MAX_PROMPTS})", param="prompt")
    for i, ids in enumerate(batch):
        where = f"prompt[{i}]" if batch is raw else "prompt"
        if not ids:
            raise BadRequest(f"{where} is empty: give at least one token id", param="prompt")
        for j, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                got = "a negative number" if isinstance(value, int) and not isinstance(value, bool) \
                    else f"a {type(value).__name__}"
                raise BadRequest(f"{where}[{j}] is not a token id (an integer from 0), it is {got}: {shape}",
                                 param="prompt")
    return {"token_prompts": tuple(tuple(ids) for ids in batch)}


def _prompt_logprobs(value: JSONValue, limit: int, *, chat: bool, stream: bool) -> int | None:
    """vLLM's `prompt_logprobs`: how many of the most likely tokens to return at each prompt position
    (0: the prompt's own token only), at most `limit`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest("prompt_logprobs must be an integer from 0: the most likely tokens to return at each "
                         "prompt position", param="prompt_logprobs")
    if value > limit:  # vLLM's words, and how to raise the limit here
        raise BadRequest(f"Requested prompt logprobs of {value}, which is greater than max allowed: {limit} "
                         f"(the server's --max-logprobs)", param="prompt_logprobs")
    if chat:
        raise BadRequest("prompt_logprobs is answered on /v1/completions", param="prompt_logprobs")
    if stream:
        raise BadRequest("prompt_logprobs are not available when stream=true", param="prompt_logprobs")
    return value


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


def _stop(raw: JSONValue) -> list[str]:
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


@dataclass
class Answer:
    """One choice of a non-streamed answer: its text, finish reason and (asked for) the prompt's log-probs."""

    text: str
    finish_reason: str
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None


def completion(request: Request, rid: str, answers: list[Answer], tokens: tuple[int, int]) -> dict[str, Any]:
    """The whole answer to a non-streamed request, a choice per prompt (`tokens`: prompt and completion
    token counts, summed over the choices)."""
    choices: list[dict[str, Any]] = []
    for index, answer in enumerate(answers):
        if request.is_chat:
            choices.append({"index": index, "message": {"role": "assistant", "content": answer.text},
                            "finish_reason": answer.finish_reason, "logprobs": None})
            continue
        choice = {"index": index, "text": answer.text, "finish_reason": answer.finish_reason, "logprobs": None}
        if request.prompt_logprobs is not None:
            choice["prompt_logprobs"] = answer.prompt_logprobs
        choices.append(choice)
    return {"id": rid, "object": "chat.completion" if request.is_chat else "text_completion",
            "created": int(time.time()), "model": request.model, "choices": choices, "usage": usage(*tokens)}


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


@dataclass(frozen=True)
class TokenizeRequest:
    """vLLM's ``POST /tokenize`` for a text prompt."""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


def parse_tokenize(body: JSONValue, *, served: str) -> TokenizeRequest:
    """A `TokenizeRequest` from a decoded JSON body (`model` may be left out, as vLLM allows)."""
    _checked_body(body, served, model_required=False)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string: the text to tokenize", param="prompt")
    flags = {}
    for key, default in (("add_special_tokens", True), ("return_token_strs", False)):
        value = body.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, bool):
            raise BadRequest(f"{key} must be true or false", param=key)
        flags[key] = value
    return TokenizeRequest(prompt=prompt, **flags)
