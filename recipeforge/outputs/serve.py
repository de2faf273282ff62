"""`recipeforge serve RUN_DIR`: a finished run's model behind an OpenAI-compatible HTTP API.

Two engines. ``transformers`` (always there) serves final/ as saved, a LoRA adapter on its base
without merging (`chat.load_chat_model`), from the standard library's threading HTTP server:
``/v1/chat/completions`` and ``/v1/completions`` (streamed as server-sent events or whole),
``/v1/models`` and ``/health``. Requests are answered one at a time (a lock around generation): it is
for trying a model, a demo or an evaluation harness, not for traffic. ``vllm`` hands the run to
``vllm serve`` (continuous batching; a LoRA adapter served as an adapter on its base), same API.

The server binds to 127.0.0.1 unless told otherwise, and checks ``Authorization: Bearer KEY`` when
given an API key.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

from recipeforge.errors import RecipeError
from recipeforge.outputs import openai_api as api
from recipeforge.outputs.openai_api import BadRequest, Request

ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}  # path -> is chat


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

    def prompt_ids(self, request: Request) -> Any:
        """Token ids of the request's prompt: chat messages through the run's chat template (with the
        generation prompt), or the completion prompt as text."""
        if request.is_chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise BadRequest("this run's tokenizer has no chat template (a pretraining run): use /v1/completions")
            ids = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True,
                                                     return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = self.tokenizer(request.prompt, return_tensors="pt")["input_ids"]
        return ids.to(self.model.device)

    def pieces(self, request: Request, generation: Generation) -> Iterator[str]:
        """The reply's text as generated, held back near a possible stop string and cut at one;
        `generation` is filled in when the stream ends. The caller holds `lock`."""
        from recipeforge.outputs.chat import Sampling, stream_reply

        ids = self.prompt_ids(request)
        generation.prompt_tokens = int(ids.shape[1])
        sampling = Sampling(max_new_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p)
        stop, result = threading.Event(), {}
        hold = max((len(s) for s in request.stop), default=1) - 1
        text, sent = "", 0
        for piece in stream_reply(self.model, self.tokenizer, ids, sampling, stop, result):
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
        generation.finish_reason = "length" if not stopped and generation.completion_tokens >= request.max_tokens \
            else "stop"


class ModelServer(ThreadingHTTPServer):
    """The HTTP server of one served model."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, name: str, api_key: str | None):
        super().__init__(address, Handler)
        self.name, self.api_key = name, api_key
        self.created = int(time.time())
        self.generator: Generator | None = None  # set once the model is loaded

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"


class Handler(BaseHTTPRequestHandler):
    """Routes the OpenAI endpoints to the server's generator."""

    server: ModelServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if not self._authorized():
            return None
        if self.path == "/v1/models":
            return self._json(200, api.models_list(self.server.name, self.server.created))
        return self._json(404, api.error_body(f"no route {self.path}", kind="not_found_error"))

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return None
        chat = ROUTES.get(self.path.split("?")[0])
        if chat is None:
            return self._json(404, api.error_body(f"no route {self.path}", kind="not_found_error"))
        try:
            request = api.parse_request(self._body(), chat=chat, served=self.server.name)
            generator = self.server.generator
            assert generator is not None
            with generator.lock:
                if request.stream:
                    return self._stream(generator, request)
                generation = Generation()
                text = "".join(generator.pieces(request, generation))
        except BadRequest as exc:
            return self._json(exc.status, exc.body())
        tokens = (generation.prompt_tokens, generation.completion_tokens)
        return self._json(200, api.completion(request, api.new_id(request), text, generation.finish_reason, tokens))

    def _stream(self, generator: Generator, request: Request) -> None:
        """Server-sent events: the pieces as they are generated, then the finish reason and [DONE]."""
        generation, rid = Generation(), api.new_id(request)
        pieces = generator.pieces(request, generation)
        first = next(pieces, None)  # a bad prompt is still an HTTP error, before the stream starts
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
            self._event(api.chunk(request, rid, finish_reason=generation.finish_reason))
            if request.include_usage:
                self._event(api.usage_chunk(request, rid, (generation.prompt_tokens, generation.completion_tokens)))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client left: stop generating for it
            pieces.close()

    def _event(self, payload: dict[str, Any] | None) -> None:
        if payload is not None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._json(401, api.error_body("missing or wrong API key (Authorization: Bearer KEY)",
                                       kind="authentication_error", code="invalid_api_key"))
        return False

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            raise BadRequest("the request body is not JSON") from None

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def bind(host: str, port: int, *, name: str, api_key: str | None) -> ModelServer:
    """The server bound to `host`:`port` (0: any free port); a `RecipeError` when the port is taken."""
    try:
        return ModelServer((host, port), name=name, api_key=api_key)
    except OSError as exc:
        raise RecipeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                          hint="pick a free port with --port (0 takes any free one) or stop what holds it") from None


def announce(server: ModelServer, api_key: str | None) -> str:
    """What the server prints once it answers: the URL and a curl line to try it."""
    auth = f" -H 'Authorization: Bearer {api_key}'" if api_key else ""
    body = json.dumps({"model": server.name, "messages": [{"role": "user", "content": "Hello!"}]})
    return (f"serving {server.name} at {server.url} (OpenAI API; Ctrl-C to stop)\n"
            f"  curl {server.url}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'")


def serve_run(run_dir: Path, *, host: str, port: int, name: str, api_key: str | None, device: str | None) -> None:
    """Serve `run_dir`'s final/ with the transformers engine until interrupted."""
    from recipeforge.outputs.chat import load_chat_model

    server = bind(host, port, name=name, api_key=api_key)  # a taken port is said before minutes of loading
    try:
        model, tokenizer = load_chat_model(run_dir, device=device)
        server.generator = Generator(model, tokenizer)
        print(announce(server, api_key), flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
