"""A distillation teacher asked over HTTP: any OpenAI-compatible completions server that returns prompt
log-probs for token-id prompts (``vllm serve``, or ``recipeforge serve`` of the teacher run).

Each row of a batch is sent unpadded (its positions with attention mask 1) as a token-id prompt of
``/v1/completions`` with ``prompt_logprobs: k`` and ``max_tokens: 1`` (the generated token is not
used); rows go in batches of `ROWS_PER_REQUEST` prompts. The server's entry at prompt index t + 1 is
the teacher's distribution predicting token t + 1 from the tokens before it, so it fills position t of
`TeacherTopK` (position t predicts token t + 1, as the student's logits at t do).

Positions with nothing to predict hold a placeholder: every padded position, and each row's last real
token (its next token is beyond the sequence, where no label is either). The placeholder is the
uniform distribution over ids 0..k-1 (log-probs log(1/k)), a valid distribution that keeps a loss
finite; `scored_positions` is the mask of the positions that hold the teacher's answer. The distill
loss weighs only positions with a label, which the placeholders never have.

Errors are `RecipeError`s at ``distill.teacher.url`` (``distill.temperature`` for a temperature other
than 1): a server that cannot be reached (after `CONNECT_ATTEMPTS` tries), that refuses the key or the
request, that returns fewer than k log-probs per position (vLLM's ``max_logprobs`` below
``distill.top_k``), or whose tokenizer splits a probe text differently from the student's.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Protocol

import torch

from recipeforge.components.teacher_topk import TeacherTopK
from recipeforge.errors import RecipeError
from recipeforge.json_value import JSONValue

KEY = "distill.teacher.url"
ROWS_PER_REQUEST = 8     # token-id prompts per scoring request (answers grow as rows x length x k)
CONNECT_ATTEMPTS = 3     # tries of a request that cannot connect, a second apart and then two
PROBE_TEXT = "Distillation probe: the teacher's tokenizer must split 12,345 words and ümlauts as the student's."
LOGPROBS_HINT = ("raise the server's limit to at least distill.top_k (`vllm serve --max-logprobs N`, "
                 "`recipeforge serve --max-logprobs N`), or lower distill.top_k")


class TeacherSettings(Protocol):
    """What a served teacher reads of `distill.teacher` (recipeforge.config.schema.distill.TeacherConfig)."""

    url: str | None
    served_model: str | None
    api_key_env: str | None
    timeout_s: float


def scored_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the positions `ServedTeacher.top_k` fills with the teacher's answer (a real token
    followed by another real token); the others hold the uniform placeholder."""
    mask = attention_mask.bool()
    later = mask.flip(-1).long().cumsum(-1).flip(-1) > 1  # a real token comes after this position
    return mask & later


class ServedTeacher:
    """The teacher interface of the distill stage, answered by a server (`TeacherSettings.url`)."""

    def __init__(self, config: TeacherSettings, *, vocab_size: int | None = None,
                 probe: Callable[[str], list[int]] | None = None):
        """Connect to the server: find the model to ask (`served_model`, else the first it lists) and,
        given `probe` (the student's tokenizer's encode), check the server's `/tokenize` splits a text
        as the student's does (a server without `/tokenize` is not checked). `vocab_size`: the student's;
        a teacher token past it is an error."""
        if not config.url:
            raise RecipeError("a served teacher needs a URL", key=KEY, hint="set distill.teacher.url")
        self.url = config.url.rstrip("/")
        self.timeout_s = float(config.timeout_s)
        self.vocab_size = vocab_size
        self.headers = {"Content-Type": "application/json", "User-Agent": "recipeforge"}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise RecipeError(f"the environment variable {config.api_key_env} (distill.teacher.api_key_env) is "
                                  "not set or empty", key="distill.teacher.api_key_env",
                                  hint=f"export {config.api_key_env}=KEY, the API key the teacher's server takes")
            self.headers["Authorization"] = f"Bearer {key}"
        self.model = config.served_model or self._first_model()
        if probe is not None:
            self._check_tokenizer(probe)

    def top_k(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, k: int,
              temperature: float) -> TeacherTopK:
        """The teacher's `k` most likely next tokens and their log-probs at each position of the batch
        ([B, T] ids and mask, any padding side); placeholders where nothing is predicted (module doc)."""
        if temperature != 1:
            raise RecipeError(f"a served teacher answers log-probs at temperature 1, not {temperature}",
                              key="distill.temperature",
                              hint="set distill.temperature: 1, or load the teacher in the run (distill.teacher."
                                   "name_or_path), where any temperature applies")
        batch, length = input_ids.shape
        logprobs = torch.full((batch, length, k), -math.log(k), dtype=torch.float32)
        ids = torch.arange(k, dtype=torch.int64).expand(batch, length, k).clone()
        rows = []
        for b in range(batch):
            positions = attention_mask[b].nonzero().flatten().tolist()
            if len(positions) > 1:  # one token predicts nothing inside the sequence
                rows.append((b, positions, input_ids[b, positions].tolist()))
        for start in range(0, len(rows), ROWS_PER_REQUEST):
            chunk = rows[start:start + ROWS_PER_REQUEST]
            answers = self._score([tokens for _, _, tokens in chunk], k)
            for (b, positions, tokens), entries in zip(chunk, answers):
                tops = [self._top(entries[t + 1], k, where=f"row {b}, position {t + 1}") for t in range(len(tokens) - 1)]
                ids[b, positions[:-1]] = torch.tensor([[token for token, _ in top] for top in tops], dtype=torch.int64)
                logprobs[b, positions[:-1]] = torch.tensor([[lp for _, lp in top] for top in tops], dtype=torch.float32)
        return TeacherTopK(logprobs=logprobs, ids=ids)

    def _score(self, prompts: list[list[int]], k: int) -> list[list[Any]]:
        """Each prompt's `prompt_logprobs` list, in order, checked to hold one entry per token."""
        body = {"model": self.model, "prompt": prompts, "max_tokens": 1, "prompt_logprobs": k}
        answer = self._request("/completions", body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != len(prompts):
            raise self._error(f"answered {len(choices) if isinstance(choices, list) else 'no'} choices for "
                              f"{len(prompts)} prompts")
        out: list[list[Any]] = [[] for _ in prompts]
        for position, choice in enumerate(choices):
            index = choice.get("index", position) if isinstance(choice, dict) else None
            entries = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
            if not isinstance(index, int) or not 0 <= index < len(prompts) or not isinstance(entries, list):
                raise self._error("answered without prompt_logprobs: it must return prompt log-probs for "
                                  "token-id prompts (as vLLM does)")
            if len(entries) != len(prompts[index]):
                raise self._error(f"answered {len(entries)} prompt log-probs for a prompt of {len(prompts[index])} "
                                  "tokens")
            out[index] = entries
        return out

    def _top(self, entry: JSONValue, k: int, *, where: str) -> list[tuple[int, float]]:
        """The `k` most likely (token, log-prob) of one server entry, most likely first: by the server's
        rank when it gives one (the prompt's own token, listed too, may rank past k), else by log-prob."""
        if not isinstance(entry, dict):
            raise self._error(f"answered no log-probs at {where}")
        found = []
        for token, value in entry.items():
            try:
                token_id = int(token)
                logprob = float(value["logprob"] if isinstance(value, dict) else value)
                rank = value.get("rank") if isinstance(value, dict) else None
            except (TypeError, ValueError, KeyError):
                raise self._error(f"answered a log-prob entry that is not {{token id: {{logprob, rank}}}} at {where}"
                                  ) from None
            found.append((rank if isinstance(rank, int) and not isinstance(rank, bool) else None, -logprob, token_id))
        if all(rank is not None for rank, _, _ in found):
            found = sorted(item for item in found if item[0] <= k)
        else:
            found.sort(key=lambda item: (item[1], item[2]))
        if len(found) < k:
            raise RecipeError(f"the teacher at {self.url} returned {len(found)} log-probs at {where}, fewer than "
                              f"distill.top_k = {k} (its max_logprobs is lower)", key=KEY, hint=LOGPROBS_HINT)
        top = [(token_id, -neg) for _, neg, token_id in found[:k]]
        if self.vocab_size is not None and any(token_id >= self.vocab_size for token_id, _ in top):
            raise self._error(f"returned a token id past the student's vocabulary of {self.vocab_size} at {where}: "
                              "teacher and student must share a tokenizer")
        return top

    def _first_model(self) -> str:
        answer = self._request("/models", None)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) or \
                not isinstance(data[0].get("id"), str):
            raise self._error("lists no model at /models", hint="name it with distill.teacher.served_model")
        return str(data[0]["id"])

    def _check_tokenizer(self, probe: Callable[[str], list[int]]) -> None:
        root = self.url[:-3] if self.url.endswith("/v1") else self.url
        try:
            answer = self._request("/tokenize", {"model": self.model, "prompt": PROBE_TEXT}, base=root)
        except _NoRoute:
            return  # a server without /tokenize: nothing to compare
        theirs, ours = answer.get("tokens") if isinstance(answer, dict) else None, list(probe(PROBE_TEXT))
        if theirs != ours:
            raise self._error(f"splits a probe text into tokens {_head(theirs)}, the student's tokenizer into "
                              f"{_head(ours)}: distillation over token ids needs the same tokenizer",
                              hint="serve a teacher of the student's tokenizer (the same model family)")

    def _request(self, path: str, body: dict[str, Any] | None, *, base: str | None = None) -> Any:
        """The JSON answer to a GET (`body` None) or POST of `path`; connection failures are retried
        `CONNECT_ATTEMPTS` times, anything else is a `RecipeError` at once."""
        url = (base or self.url) + path
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(CONNECT_ATTEMPTS):
            request = urllib.request.Request(url, data=data, headers=self.headers, method="POST" if data else "GET")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    raw = reply.read()
                break
            except urllib.error.HTTPError as exc:
                raise self._http_error(exc, path) from None
            except (urllib.error.URLError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, TimeoutError) or attempt == CONNECT_ATTEMPTS - 1:
                    raise self._unreachable(reason) from None
                time.sleep(1.0 + attempt)
            except TimeoutError as exc:
                raise self._unreachable(exc) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise self._error(f"answered {path} with something that is not JSON") from None

    def _http_error(self, exc: urllib.error.HTTPError, path: str) -> Exception:
        try:
            detail = json.loads(exc.read() or b"null")
        except (ValueError, OSError):
            detail = None
        error = detail.get("error") if isinstance(detail, dict) else None
        message = str(error.get("message") if isinstance(error, dict) else error or detail or exc.reason)
        if exc.code == 404 and path == "/tokenize":
            return _NoRoute()
        if exc.code in (401, 403):
            return self._error(f"refused the API key (HTTP {exc.code}): {message}",
                               hint="set distill.teacher.api_key_env to the variable holding the key the server takes")
        if "logprobs" in message and ("max allowed" in message or "max_logprobs" in message):
            return RecipeError(f"the teacher at {self.url} refuses this many log-probs: {message}", key=KEY,
                               hint=LOGPROBS_HINT)
        return self._error(f"answered {path} with HTTP {exc.code}: {message}")

    def _unreachable(self, reason: object) -> RecipeError:
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return self._error(f"did not answer within distill.teacher.timeout_s = {self.timeout_s:g} s",
                               hint="raise distill.teacher.timeout_s, or check the server is not overloaded")
        return self._error(f"cannot be reached: {reason}",
                           hint="start the teacher's server (`recipeforge serve TEACHER_RUN` or `vllm serve "
                                "MODEL`) or fix distill.teacher.url (the base URL, e.g. http://HOST:8000/v1)")

    def _error(self, what: str, *, hint: str | None = None) -> RecipeError:
        return RecipeError(f"the teacher at {self.url} {what}", key=KEY, hint=hint)


class _NoRoute(Exception):
    """The server has no such endpoint (404)."""


def _head(tokens: object) -> str:
    """The first token ids of a list, for a message."""
    if not isinstance(tokens, list):
        return repr(tokens)[:40]
    return str(tokens[:8])[:-1] + (", ...]" if len(tokens) > 8 else "]")
