"""Bounded calls to a generation server: a hung or dead server stops the run, naming it, in time.

TRL's `VLLMClient` sends its requests without a timeout and retries a refused connection for about a
minute, so a server that hangs holds a run forever. Here every request of server mode has a deadline
from the recipe: ``rollout.timeout_s`` for generation, ``rollout.sync_timeout_s`` for a weight sync
(the requests that load weights into the server and reset its cache). A request that gets no answer
in time, or a server that keeps refusing connections (or answering 502/503) for `RECONNECT_S`, is a
`RecipeError` naming the server's URL, what it was doing and the key: the run exits with 2, and the
checkpoints already written stay (they are published atomically), so `train` resumes from the last.

NCCL weight transfers (a CUDA trainer) cannot be interrupted from Python: a transfer still running
at its deadline ends the process with exit 2 (`hard_deadline`), after printing the same message.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import urlparse

from recipeforge.errors import RecipeError

GENERATION = "generation"
SYNC = "weight sync"
# The server's endpoints that take part in a weight sync (TRL's NCCL engine, vLLM's in-place reload).
SYNC_PATHS = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights", "/finish_weight_update",
              "/reset_prefix_cache", "/collective_rpc")
RECONNECT_S = 30.0  # how long a refused connection is retried (within the deadline) before the server counts as gone
CONNECT_S = 10.0  # seconds to open a connection (a server that accepts none is as good as dead)
HARD_GRACE_S = 10.0  # an NCCL transfer gets this long past its deadline for the HTTP side to report first


@dataclass
class ServerTimeouts:
    """The deadlines of one run's generation server, and where the recipe sets them (`section` is set
    again once the trainer shows which on-policy stage runs)."""

    url: str
    generation_s: float
    sync_s: float
    section: str = "grpo"  # the on-policy stage's section (`grpo`, `rloo`)

    def of(self, what: str) -> tuple[float, str]:
        """(seconds, recipe key) of a `GENERATION` or `SYNC` call."""
        if what == SYNC:
            return self.sync_s, f"{self.section}.rollout.sync_timeout_s"
        return self.generation_s, f"{self.section}.rollout.timeout_s"

    def error(self, what: str, reason: str) -> RecipeError:
        """The run's error for a `what` call the server did not complete (`reason`: what it did instead)."""
        seconds, key = self.of(what)
        return RecipeError(f"the generation server at {self.url} {reason} during {what} ({key}: {seconds:g} s)",
                           key=key,
                           hint="checkpoints already written are kept: check the server (its log, its memory), "
                                "start it again and run the same train command to resume from the last one; raise "
                                f"{key} when the server is only slow")


def what_of(url: str) -> str:
    """Whether a request to `url` is part of a weight sync or of generation."""
    path = urlparse(url).path.rstrip("/")
    return SYNC if any(path.endswith(p) for p in SYNC_PATHS) else GENERATION


def bounded_session(timeouts: ServerTimeouts) -> Any:
    """A `requests.Session` whose every request has the deadline of what it does (`what_of`), retries a
    refused connection or a 502/503 within it for at most `RECONNECT_S`, and raises `timeouts.error`
    when the server does not answer."""
    import requests
    from requests.adapters import HTTPAdapter

    class BoundedSession(requests.Session):
        def __init__(self) -> None:
            super().__init__()
            # No retries below this class: each would start the read timeout over.
            super().mount("http://", HTTPAdapter(max_retries=0, pool_maxsize=32))
            super().mount("https://", HTTPAdapter(max_retries=0, pool_maxsize=32))

        def mount(self, prefix: str, adapter: Any) -> None:
            """Adapters mounted later (TRL's retrying one) are not used: retries happen here, in time."""

        def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:
            what = what_of(str(url))
            seconds, _ = timeouts.of(what)
            deadline = time.monotonic() + seconds
            refused_since: float | None = None
            while True:
                remaining = deadline - time.monotonic()
                kwargs["timeout"] = (min(CONNECT_S, max(remaining, 0.1)), max(remaining, 0.1))
                try:
                    response = super().request(method, url, *args, **kwargs)
                except requests.exceptions.ReadTimeout:
                    raise timeouts.error(what, f"did not answer within {seconds:g} s") from None
                except requests.exceptions.ConnectionError as exc:
                    reason = _refusal(exc)
                else:
                    if response.status_code not in (502, 503):
                        return response
                    reason = f"answered HTTP {response.status_code} for {{seconds}} s"
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                if now - refused_since >= RECONNECT_S or now + 1.0 >= deadline:
                    raise timeouts.error(what, reason.format(seconds=f"{now - refused_since:.0f}"))
                time.sleep(1.0)

    return BoundedSession()


def _refusal(exc: BaseException) -> str:
    """What a server that failed a request with `exc` did, with a ``{seconds}`` field for how long."""
    text = str(exc).lower()
    if "refused" in text:
        return "refused the connection for {seconds} s (is it running?)"
    if "timed out" in text or "timeout" in text:
        return "accepted no connection for {seconds} s"
    return "closed the connection for {seconds} s"


def bounded_client_class(timeouts: ServerTimeouts) -> type:
    """TRL's `VLLMClient` with `bounded_session` for every request, a bounded wait for the server at
    start, and a `hard_deadline` on the NCCL weight transfer."""
    import requests
    from trl.generation.vllm_client import VLLMClient

    class BoundedVLLMClient(VLLMClient):  # type: ignore[misc]
        deadlines = timeouts

        @property
        def session(self) -> Any:
            return self._bounded

        @session.setter
        def session(self, _: Any) -> None:  # TRL's own session: replaced by the bounded one
            self._bounded = bounded_session(timeouts)

        def check_server(self, total_timeout: float = 0.0, retry_interval: float = 2.0) -> None:
            """Wait up to `total_timeout` for /health (TRL's own wait has no timeout on each request)."""
            deadline = time.monotonic() + total_timeout
            while True:
                try:
                    if requests.get(f"{self.base_url}/health", timeout=CONNECT_S).status_code == 200:
                        return
                except requests.exceptions.RequestException:
                    pass
                if time.monotonic() >= deadline:
                    raise RecipeError(f"the generation server at {self.base_url} did not answer /health within "
                                      f"{total_timeout:g} s", key=f"{timeouts.section}.rollout.server_url",
                                      hint=f"start the server (vllm serve), or point server_url at it; "
                                           f"{timeouts.section}.rollout.options.server_timeout is how long the "
                                           f"run waits")
                time.sleep(retry_interval)

        def init_communicator(self, *args: Any, **kwargs: Any) -> None:
            with hard_deadline(timeouts, SYNC):
                super().init_communicator(*args, **kwargs)

        def update_named_params(self, *args: Any, **kwargs: Any) -> None:
            with hard_deadline(timeouts, SYNC):
                super().update_named_params(*args, **kwargs)

    return BoundedVLLMClient


def install_bounded_client(timeouts: ServerTimeouts) -> None:
    """Have TRL's vLLM server mode (`VLLMGeneration`) build its client with these deadlines. The client is
    made inside TRL's trainer, from the name its module imported: that name is rebound (one run per
    process, so one server's deadlines)."""
    import trl.generation.vllm_generation as generation

    generation.VLLMClient = bounded_client_class(timeouts)


@contextmanager
def hard_deadline(timeouts: ServerTimeouts, what: str) -> Iterator[None]:
    """Run the block; if it is still running `HARD_GRACE_S` after the deadline of `what` (blocked in a
    collective that Python cannot interrupt), print the run's error and end the process with exit 2."""
    seconds, _ = timeouts.of(what)
    error = timeouts.error(what, f"did not complete the transfer within {seconds:g} s")
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds + HARD_GRACE_S):
            print(f"error: {error.render()}", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watch, name="recipeforge-sync-deadline", daemon=True).start()
    try:
        yield
    finally:
        done.set()
