"""`recipeforge serve RUN_DIR`: a finished run's model behind an OpenAI-compatible HTTP API.

Two engines. ``transformers`` (always there) serves final/ as saved, a LoRA adapter on its base
without merging (`chat.load_chat_model`), from the standard library's threading HTTP server:
``/v1/chat/completions`` and ``/v1/completions`` (streamed as server-sent events or whole),
``/v1/models``, ``/health`` and vLLM's ``/tokenize``; a completion prompt may be token ids (one list,
or a batch of lists: a choice each) and ask for ``prompt_logprobs`` (`serve_scoring`), up to
``--max-logprobs`` of them per position. Requests are answered one at a time (a lock around generation): it is
for trying a model, a demo or an evaluation harness, not for traffic. ``vllm`` hands the run to
``vllm serve`` (continuous batching; a LoRA adapter served as an adapter on its base), same API.

The server binds to 127.0.0.1 unless told otherwise (beyond it only with an API key, or `--insecure`;
`serve_access`), and checks ``Authorization: Bearer KEY`` when given an API key. It refuses what an
OpenAI-compatible server refuses, in OpenAI's error shape: a body over `MAX_BODY` bytes (413), no or a
malformed Content-Length (411/400), a request line or headers http.server cannot parse (400), a prompt
past the model's context or `max_tokens` past what the context leaves (400, ``context_length_exceeded``),
token ids past the vocabulary and more ``prompt_logprobs`` than the limit (400).
A client that leaves stops its generation at the next token, which frees the model for the next one.
"""

from __future__ import annotations

import hmac
import json
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

from recipeforge.errors import RecipeError
from recipeforge.tools import openai_api as api
from recipeforge.tools.openai_api import Answer, BadRequest, Request

ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}  # path -> is chat
TOKENIZE = "/tokenize"  # vLLM's, at the root as vLLM serves it
MAX_BODY = 4 * 2**20   # bytes of one request body: a long conversation is kilobytes, a model's context far less
SOCKET_TIMEOUT_S = 60  # a client silent this long mid-request is dropped (its thread freed)


@dataclass
class Generation:
    """One request's generation: its text pieces as they come (cut at a stop string), then its
    finish reason and token counts."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"


@dataclass
class Generator:
    """The model and tokenizer of a run, generating for one request at a time."""

    model: Any
    tokenizer: Any
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def context_length(self) -> int:
        """Tokens the model reads at most (`chat.context_length`)."""
        from recipeforge.tools.chat import context_length

        return context_length(self.model, self.tokenizer)

    @property
    def vocab_size(self) -> int:
        """Token ids the model reads: the rows of its input embedding."""
        return int(self.model.get_input_embeddings().num_embeddings)

    def check_token_prompts(self, request: Request) -> None:
        """Refuse (a `BadRequest`) token-id prompts with an id past the vocabulary or past the context,
        before any of them is answered."""
        vocab, context = self.vocab_size, self.context_length
        for i, ids in enumerate(request.token_prompts or ()):
            where = f"prompt[{i}]" if request.prompt_count > 1 else "prompt"
            past = next((j for j, token in enumerate(ids) if token >= vocab), None)
            if past is not None:
                shown = str(ids[past]) if ids[past] < 10**15 else f"{str(ids[past])[:15]}..."
                raise BadRequest(f"{where}[{past}] is token id {shown}, past the model's vocabulary of {vocab} "
                                 f"tokens", param="prompt")
            problem = api.context_exceeded(context=context, prompt_tokens=len(ids), max_tokens=request.max_tokens,
                                           given=request.max_tokens_given, chat=False)
            if problem:
                raise BadRequest(problem if request.prompt_count == 1 else f"{where}: {problem}", param="prompt",
                                 code="context_length_exceeded")

    def prompt_ids(self, request: Request, index: int = 0) -> Any:
        """Token ids of the request's prompt: chat messages through the run's chat template (with the
        generation prompt), the completion prompt as text, or prompt `index` of token-id prompts."""
        import torch
        from jinja2.exceptions import TemplateError

        if request.token_prompts is not None:
            return torch.tensor([request.token_prompts[index]], dtype=torch.long, device=self.model.device)
        if request.is_chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise BadRequest("this run's tokenizer has no chat template (a pretraining run): use /v1/completions")
            try:
                ids = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True,
                                                         return_tensors="pt", return_dict=True)["input_ids"]
            except TemplateError as exc:  # e.g. roles that do not alternate, as the template requires
                raise BadRequest(f"the model's chat template refuses these messages: {exc}",
                                 param="messages") from None
        else:
            ids = self.tokenizer(request.prompt, return_tensors="pt")["input_ids"]
        return ids.to(self.model.device)

    def pieces(self, request: Request, generation: Generation,
               client_gone: Callable[[], bool] = lambda: False, index: int = 0) -> Iterator[str]:
        """The reply's text to prompt `index` as generated, held back near a possible stop string and cut
        at one; `generation` is filled in when the stream ends. A prompt that does not fit the context is
        a `BadRequest` before anything is generated; `client_gone` is asked after every piece and ends the
        generation when it says yes. The caller holds `lock`."""
        from recipeforge.tools.chat import Sampling, stream_reply

        ids = self.prompt_ids(request, index)
        generation.prompt_tokens = int(ids.shape[1])
        context = self.context_length
        problem = api.context_exceeded(context=context, prompt_tokens=generation.prompt_tokens,
                                       max_tokens=request.max_tokens, given=request.max_tokens_given,
                                       chat=request.is_chat)
        if problem:
            raise BadRequest(problem, param="messages" if request.is_chat else "prompt", code="context_length_exceeded")
        max_tokens = min(request.max_tokens, context - generation.prompt_tokens)
        sampling = Sampling(max_new_tokens=max_tokens, temperature=request.temperature, top_p=request.top_p,
                            min_new_tokens=min(request.min_tokens, max_tokens))
        stop, result = threading.Event(), {}
        hold = max((len(s) for s in request.stop), default=1) - 1
        text, sent = "", 0
        for piece in stream_reply(self.model, self.tokenizer, ids, sampling, stop, result):
            if client_gone():  # nobody reads the rest: stop now and free the model for the next request
                stop.set()
                generation.finish_reason = "abandoned"
                return
            text += piece
            cut, found = api.cut_at_stop(text, request.stop)
            if found:
                stop.set()
                yield cut[sent:]
                sent = len(cut)
                break
            if len(text) - hold > sent:
                yield text[sent:len(text) - hold]
                sent = len(text) - hold
        else:
            if text[sent:]:
                yield text[sent:]
        generated = result.get("ids")
        generation.completion_tokens = int(generated.shape[1]) - generation.prompt_tokens if generated is not None else 0
        stopped = api.cut_at_stop(text, request.stop)[1]
        generation.finish_reason = "length" if not stopped and generation.completion_tokens >= max_tokens \
            else "stop"


class ModelServer(ThreadingHTTPServer):
    """The HTTP server of one served model."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, name: str, api_key: str | None,
                 max_logprobs: int = api.DEFAULT_MAX_LOGPROBS):
        super().__init__(address, Handler)
        self.name, self.api_key, self.max_logprobs = name, api_key, max_logprobs
        self.created = int(time.time())
        self.generator: Generator | None = None  # set once the model is loaded

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"


class Handler(BaseHTTPRequestHandler):
    """Routes the OpenAI endpoints to the server's generator; every answer, errors included, is JSON in
    OpenAI's shape."""

    server: ModelServer
    timeout = SOCKET_TIMEOUT_S  # socketserver applies it to the connection: a stalled client is dropped
    protocol_version = "HTTP/1.0"  # one request per connection: the length of every answer is its own

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if not self._authorized():
            return None
        if self.path == "/v1/models":
            return self._json(200, api.models_list(self.server.name, self.server.created))
        return self._json(404, api.error_body(f"no route {self.path[:100]}", kind="not_found_error"))

    def do_POST(self) -> None:  # noqa: N802
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client left or went silent: nobody to answer
        except Exception as exc:  # a failure of the model or a library: a 500 for this request, the server goes on
            self.log_error("request failed: %s: %s", type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            self.close_connection = True
            if getattr(self, "_streaming", False):
                return  # the stream's status line is sent: closing it is all that is left to say
            try:
                self._json(500, api.error_body("the server failed to answer this request", kind="server_error"))
            except OSError:
                pass

    def _post(self) -> None:
        if not self._authorized():
            return None
        path = self.path.split("?")[0]
        chat = ROUTES.get(path)
        if chat is None and path != TOKENIZE:
            return self._json(404, api.error_body(f"no route {self.path[:100]}", kind="not_found_error"))
        generator = self.server.generator
        assert generator is not None
        try:
            if chat is None:
                return self._tokenize(generator, api.parse_tokenize(self._body(), served=self.server.name))
            request = api.parse_request(self._body(), chat=chat, served=self.server.name,
                                        max_logprobs=self.server.max_logprobs)
            generator.check_token_prompts(request)
            with generator.lock:
                if request.stream:
                    return self._stream(generator, request)
                answers, tokens = [], (0, 0)
                for index in range(request.prompt_count):
                    generation = Generation()
                    logprobs = None
                    if request.prompt_logprobs is not None:
                        from recipeforge.tools.serve_scoring import prompt_logprobs

                        ids = generator.prompt_ids(request, index)[0].tolist()
                        logprobs = prompt_logprobs(generator.model, generator.tokenizer, ids, request.prompt_logprobs)
                    text = "".join(generator.pieces(request, generation, self._client_gone, index))
                    if generation.finish_reason == "abandoned":
                        return self._abandoned()
                    answers.append(Answer(text, generation.finish_reason, logprobs))
                    tokens = (tokens[0] + generation.prompt_tokens, tokens[1] + generation.completion_tokens)
        except BadRequest as exc:
            return self._json(exc.status, exc.body())
        return self._json(200, api.completion(request, api.new_id(request), answers, tokens))

    def _tokenize(self, generator: Generator, request: api.TokenizeRequest) -> None:
        """vLLM's ``/tokenize``: the text's token ids, as the served model's tokenizer gives them."""
        from recipeforge.tools.serve_scoring import tokenize

        with generator.lock:  # the tokenizer is not shared between threads mid-call
            answer = tokenize(generator.tokenizer, request, context=generator.context_length)
        return self._json(200, answer)

    def _stream(self, generator: Generator, request: Request) -> None:
        """Server-sent events: the pieces as they are generated, then the finish reason and [DONE]."""
        generation, rid = Generation(), api.new_id(request)
        pieces = generator.pieces(request, generation, self._client_gone)
        first = next(pieces, None)  # a bad prompt is still an HTTP error, before the stream starts
        if generation.finish_reason == "abandoned":
            return self._abandoned()
        self._streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            self._event(api.chunk(request, rid, first=True) if request.is_chat else None)
            if first:
                self._event(api.chunk(request, rid, text=first))
            for piece in pieces:
                self._event(api.chunk(request, rid, text=piece))
            if generation.finish_reason == "abandoned":
                return self._abandoned()
            self._event(api.chunk(request, rid, finish_reason=generation.finish_reason))
            if request.include_usage:
                self._event(api.usage_chunk(request, rid, (generation.prompt_tokens, generation.completion_tokens)))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left: stop generating for it
            pieces.close()
            self._abandoned()

    def _abandoned(self) -> None:
        self.close_connection = True
        self.log_message('"%s" client left: generation stopped', self.requestline)

    def _event(self, payload: dict[str, Any] | None) -> None:
        if payload is not None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    def _client_gone(self) -> bool:
        """Whether the client closed its side (a readable socket with nothing left to read); it sends
        nothing more after its request."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _authorized(self) -> bool:
        key = self.server.api_key
        given = self.headers.get("Authorization", "")
        # A constant-time comparison: how long a wrong key takes to refuse says nothing about the right one.
        if key is None or hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                              f"Bearer {key}".encode("utf-8", "surrogateescape")):
            return True
        self._json(401, api.error_body("missing or wrong API key (Authorization: Bearer KEY)",
                                       kind="authentication_error", code="invalid_api_key"))
        return False

    def _body(self) -> Any:
        """The request's JSON body, at most `MAX_BODY` bytes; a `BadRequest` in OpenAI's shape otherwise."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise BadRequest("chunked request bodies are not accepted: send Content-Length", status=411)
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise BadRequest("a request body needs a Content-Length header", status=411)
        if not raw.strip().isdecimal():
            raise BadRequest(f"Content-Length {raw[:40]!r} is not a byte count")
        length = int(raw)
        if length > MAX_BODY:
            raise BadRequest(f"the request body is {length} bytes, more than this server reads ({MAX_BODY})",
                             status=413)
        data = self.rfile.read(length)
        if len(data) < length:
            raise BadRequest(f"the request body ended after {len(data)} of {length} bytes")
        try:
            return json.loads(data or b"null")
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's limit
            raise BadRequest("the request body is not JSON") from None

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line or header, an unsupported method, a header
        too long) in OpenAI's JSON shape instead of an HTML page."""
        try:
            short, _ = self.responses.get(code, ("error", ""))
        except AttributeError:
            short = "error"
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # an unparsable request line still gets a status line and headers
        kind = "invalid_request_error" if 400 <= code < 500 else "server_error"
        body = json.dumps(api.error_body(message or short, kind=kind)).encode()
        try:
            self.send_response(code, short)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        """One line per request on stderr, with control characters escaped and credentials (a key in a
        query string) hidden."""
        from recipeforge.config.secrets import scrub
        from recipeforge.errors import bounded_text

        message = format % args
        sys.stderr.write(f"{self.address_string()} - [{self.log_date_time_string()}] "
                         f"{bounded_text(scrub(message))}\n")


def bind(host: str, port: int, *, name: str, api_key: str | None,
         max_logprobs: int = api.DEFAULT_MAX_LOGPROBS) -> ModelServer:
    """The server bound to `host`:`port` (0: any free port); a `RecipeError` when the port is taken."""
    try:
        return ModelServer((host, port), name=name, api_key=api_key, max_logprobs=max_logprobs)
    except OSError as exc:
        raise RecipeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="pick a free port with --port (0 takes any free one) or stop what holds it") from None


def announce(server: ModelServer, api_key: str | None) -> str:
    """What the server prints once it answers: the URL and a curl line to try it. The key itself is never
    printed: the curl line reads it from $RECIPEFORGE_API_KEY."""
    import shlex

    auth = ' -H "Authorization: Bearer $RECIPEFORGE_API_KEY"' if api_key else ""
    body = json.dumps({"model": server.name, "messages": [{"role": "user", "content": "Hello!"}]})
    return (f"serving {server.name} at {server.url} (OpenAI API; Ctrl-C to stop)\n"
            f"  curl {shlex.quote(server.url + '/chat/completions')} -H 'Content-Type: application/json'{auth} "
            f"-d {shlex.quote(body)}")


def serve_run(run_dir: Path, *, host: str, port: int, name: str, api_key: str | None, device: str | None,
              max_logprobs: int = api.DEFAULT_MAX_LOGPROBS) -> None:
    """Serve `run_dir`'s final/ with the transformers engine until interrupted (`max_logprobs`: the most
    `prompt_logprobs` a request may ask for)."""
    from recipeforge.tools.chat import load_chat_model

    server = bind(host, port, name=name, api_key=api_key, max_logprobs=max_logprobs)  # a taken port is said before minutes of loading
    try:
        model, tokenizer = load_chat_model(run_dir, device=device)
        server.generator = Generator(model, tokenizer)
        print(announce(server, api_key), flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
