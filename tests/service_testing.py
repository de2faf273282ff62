"""Local endpoints for the tests of external services: a real HTTP server on 127.0.0.1 that answers
each path as a test says (a status and a body, or no answer at all), and a port where nothing listens.

The clients under test (urllib, MLflow's requests, huggingface_hub) talk to it over TCP as they would to
the real service; only what the service answers is chosen by the test.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"{}"
    hang_s: float = 0.0  # wait this long before answering (a server that does not answer in time)


@dataclass
class Endpoint:
    """What the server answers: the first route whose (method, path prefix) matches, else `default`."""

    routes: dict = field(default_factory=dict)   # (method or "*", path prefix) -> Reply
    default: Reply = field(default_factory=lambda: Reply(404, b'{"error": "not found"}'))
    seen: list = field(default_factory=list)     # (method, path, headers) of every request
    url: str = ""

    def reply_for(self, method: str, path: str) -> Reply:
        for (m, prefix), reply in self.routes.items():
            if m in ("*", method) and path.startswith(prefix):
                return reply
        return self.default


@contextmanager
def serving(endpoint: Endpoint) -> Iterator[Endpoint]:
    """Serve `endpoint` on a free local port while the block runs; `endpoint.url` is its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            endpoint.seen.append((self.command, self.path, dict(self.headers)))
            reply = endpoint.reply_for(self.command, self.path)
            if reply.hang_s:
                time.sleep(reply.hang_s)
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        do_GET = do_POST = do_HEAD = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
