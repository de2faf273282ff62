"""`recipeforge serve` refuses what an OpenAI-compatible server refuses, in OpenAI's error shape, and does
not hand the model to whoever reaches the machine.

Before it serves: beyond localhost only with an API key (or `--insecure`, warned); an empty, blank or
unsendable key is an error; the key it was given is never printed (the startup curl line reads it from
$RECIPEFORGE_API_KEY, and works as printed). While it serves: a prompt past the model's context and a
`max_tokens` past what the context leaves are 400 `context_length_exceeded` (the official client raises
BadRequestError); bodies past the cap are 413, a missing or malformed Content-Length 411/400, a request
line http.server cannot parse, JSON nested past the parser, lone surrogates and mistyped fields 400, all
as JSON; a client that leaves stops its generation, so the next client is answered at once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from serve_testing import start_serve
from surface_testing import recipeforge, refused

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

KEY = "rf-serve-test-k3y-0123456789"


@pytest.fixture(scope="module")
def served(full_run):
    server = start_serve(full_run, env={"RECIPEFORGE_API_KEY": KEY})
    yield full_run, server.url, server.announcement, server.proc
    server.stop()


def _raw(url: str, request: bytes, timeout: float = 30) -> tuple[int, dict]:
    """Send `request` as it is; the status and the JSON body of the answer."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_who_may_reach_the_server(full_run, tmp_path):
    for args, env, words in (
            (["--host", "0.0.0.0"], {}, ("every interface without an API key", "--insecure")),
            (["--host", "::"], {}, ("without an API key",)),
            (["--host", "10.1.2.3"], {}, ("10.1.2.3 without an API key",)),
            (["--host", "my-laptop.local"], {}, ("without an API key",)),
            ([], {"RECIPEFORGE_API_KEY": ""}, ("RECIPEFORGE_API_KEY is set but empty",)),
            (["--host", "0.0.0.0"], {"RECIPEFORGE_API_KEY": "   "}, ("is set but empty",)),
            (["--api-key", ""], {}, ("--api-key is set but empty",)),
            (["--api-key", "two words"], {}, ("whitespace or control characters",))):
        refused(recipeforge("serve", str(full_run), "--port", "0", *args, cwd=tmp_path, env=env), *words)
    # --insecure serves anyway, and says so.
    server = start_serve(full_run, "--host", "0.0.0.0", "--insecure")
    proc, url = server.proc, server.url
    try:
        assert openai.OpenAI(base_url=url.replace("0.0.0.0", "127.0.0.1"), api_key="x").models.list().data
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    assert "warning: serving on every interface without an API key (--insecure)" in err


def test_the_key_is_never_printed_and_the_curl_line_works(served):
    run, url, announced, _ = served
    assert KEY not in announced and "$RECIPEFORGE_API_KEY" in announced
    curl = announced.splitlines()[-1].strip()
    done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RECIPEFORGE_API_KEY": KEY})
    reply = json.loads(done.stdout)
    assert reply["object"] == "chat.completion" and reply["model"] == run.name, done.stdout + done.stderr
    # Given on the command line instead: not printed, and a warning that the process list shows it.
    server = start_serve(run, "--api-key", KEY)
    proc, shown = server.proc, server.announcement
    proc.terminate()
    err = proc.communicate(timeout=30)[1]
    assert KEY not in shown + err and "process list" in err


def test_requests_past_the_context_are_400(served):
    run, url, _, _ = served
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    context = json.loads((run / "final" / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(openai.BadRequestError) as info:  # ten times the context
        client.completions.create(model=run.name, prompt="moo " * (10 * context), max_tokens=4)
    assert info.value.code == "context_length_exceeded" and f"maximum context length is {context}" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=run.name, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=10**9)
    assert info.value.code == "context_length_exceeded" and "in the completion" in str(info.value)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=run.name, prompt="hi", max_tokens=1e9)  # not an integer
    # Without max_tokens a long prompt is answered: the default is shortened to what the context leaves.
    long = client.completions.create(model=run.name, prompt="moo " * (context - 20), temperature=0)
    assert long.usage.prompt_tokens + long.usage.completion_tokens <= context


@pytest.mark.parametrize("request_bytes, status, words", [
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413, "more than this server reads"),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "is not a byte count"),
    (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400, "is not a byte count"),
    (b"POST /v1/completions HTTP/1.1\r\n\r\n", 411, "Content-Length"),
    (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411, "chunked"),
    (b"GARBAGE\r\n\r\n", 400, "Bad request"),
    (b"GET /v1/models HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n", 431, ""),
    (b"DELETE /v1/models HTTP/1.1\r\n\r\n", 501, ""),
], ids=["body-too-large", "negative-length", "length-not-a-number", "no-length", "chunked", "garbage-request-line",
        "header-too-long", "unknown-method"])
def test_malformed_requests_are_answered_in_openais_shape(served, request_bytes, status, words):
    _, url, _, _ = served
    auth = f"Authorization: Bearer {KEY}\r\n".encode()
    line, _, rest = request_bytes.partition(b"\r\n")
    got, body = _raw(url, line + b"\r\n" + auth + rest if rest else request_bytes)
    assert got == status and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert words in body["error"]["message"], body


@pytest.mark.parametrize("body, param", [
    ("[" * 100000 + "]" * 100000, None),
    ('{"model": "M", "prompt": "\\ud800 lone"}', "prompt"),
    ('{"model": "M", "prompt": "hi", "stream": "yes"}', "stream"),
    ('{"model": 7, "prompt": "hi"}', "model"),
    ('{"model": "M", "prompt": "hi", "n": true}', "n"),
    ('{"model": "M", "prompt": "hi", "stream_options": []}', "stream_options"),
    ('{"model": "M", "prompt": "hi", "temperature": NaN}', "temperature"),
], ids=["nested-past-the-parser", "lone-surrogate", "stream-not-bool", "model-not-a-string", "n-bool",
        "stream-options-list", "nan"])
def test_malformed_bodies_are_400(served, body, param):
    run, url, _, _ = served
    data = body.replace('"M"', json.dumps(run.name)).encode()
    got, answer = _raw(url, b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode()
                       + b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    assert got == 400 and answer["error"]["type"] == "invalid_request_error", answer
    assert answer["error"]["param"] == param, answer


def _generation_request(run: Path, *, stream: bool) -> bytes:
    body = json.dumps({"model": run.name, "prompt": "The dog says", "max_tokens": 1500, "min_tokens": 1500,
                       "stream": stream}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_frees_the_model(served, stream):
    run, url, _, proc = served
    host, port = url.split("//")[1].split("/")[0].split(":")
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
    # How long this machine takes to answer a short request when the model is free.
    started = time.monotonic()
    client.completions.create(model=run.name, prompt="hi", max_tokens=2)
    short = time.monotonic() - started
    # A long generation (1500 tokens: min_tokens, vLLM's extension, keeps end-of-text away), abandoned after 1 s.
    leaver = socket.create_connection((host, int(port)))
    leaver.sendall(_generation_request(run, stream=stream))
    time.sleep(1.0)
    leaver.close()
    started = time.monotonic()
    client.completions.create(model=run.name, prompt="hi", max_tokens=2)
    waited = time.monotonic() - started
    # Generating the abandoned 1500 tokens takes tens of seconds here; the next client waits at most a token.
    assert waited < short + 5, (waited, short)
    time.sleep(0.5)  # the log line is written as the handler returns
    assert "client left: generation stopped" in _stderr_so_far(proc)


def _stderr_so_far(proc: subprocess.Popen) -> str:
    """What the server wrote to stderr until now, read without blocking."""
    import fcntl

    fd = proc.stderr.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        return proc.stderr.read() or ""
    except (BlockingIOError, TypeError):
        return ""


def _post(url: str, path: str, body: str | bytes, *, key: str | None = KEY) -> tuple[int, dict]:
    """POST `body` as it is to `path` at the server's root (the /v1 routes and /tokenize)."""
    data = body.encode() if isinstance(body, str) else body
    auth = b"Authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    return _raw(url, b"POST " + path.encode() + b" HTTP/1.1\r\n" + auth + b"Content-Length: "
                + str(len(data)).encode() + b"\r\n\r\n" + data)


@pytest.mark.parametrize("prompt, extra, param, words", [
    ("[5, 1000000000]", "", "prompt", "past the model's vocabulary"),
    ("[5, " + "9" * 4000 + "]", "", "prompt", "past the model's vocabulary"),
    ("[5, -1]", "", "prompt", "a negative number"),
    ("[5, 6.0]", "", "prompt", "a float"),
    ("[5, true]", "", "prompt", "a bool"),
    ('[5, "6"]', "", "prompt", "a str"),
    ("[[5, [6]]]", "", "prompt", "a list"),
    ("[[[[[[5]]]]]]", "", "prompt", "a list"),
    ("[" * 900 + "5" + "]" * 900, "", "prompt", "a list"),
    ("[]", "", "prompt", "a list of token ids"),
    ("[[5], []]", "", "prompt", "prompt[1] is empty"),
    ("[" + ", ".join(["[5]"] * 65) + "]", "", "prompt", "65 prompts, more than"),
    ("[5, 6]", ', "prompt_logprobs": 21', "prompt_logprobs", "greater than max allowed: 20"),
    ("[5, 6]", ', "prompt_logprobs": 1e9', "prompt_logprobs", "an integer from 0"),
    ("[5, 6]", ', "prompt_logprobs": 2.5', "prompt_logprobs", "an integer from 0"),
    ("[5, 6]", ', "prompt_logprobs": true', "prompt_logprobs", "an integer from 0"),
    ("[5, 6]", ', "prompt_logprobs": -1', "prompt_logprobs", "an integer from 0"),
    ("[5, 6]", ', "prompt_logprobs": "3"', "prompt_logprobs", "an integer from 0"),
    ("[5, 6]", ', "prompt_logprobs": 2, "stream": true', "prompt_logprobs", "stream"),
    ("[[5], [6]]", ', "stream": true', "stream", "batch"),
], ids=["id-past-vocab", "id-huge", "id-negative", "id-float", "id-bool", "id-string", "nested-list",
        "nested-deep", "nested-near-the-parser", "empty", "empty-in-batch", "too-many-prompts", "logprobs-over-limit",
        "logprobs-float-huge", "logprobs-float", "logprobs-bool", "logprobs-negative", "logprobs-string",
        "logprobs-streamed", "batch-streamed"])
def test_hostile_token_prompts_and_prompt_logprobs_are_400(served, prompt, extra, param, words):
    run, url, _, _ = served
    status, answer = _post(url, "/v1/completions", f'{{"model": {json.dumps(run.name)}, "prompt": {prompt}, '
                                                   f'"max_tokens": 1{extra}}}')
    assert status == 400 and set(answer["error"]) == {"message", "type", "param", "code"}, answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"], answer
    assert len(answer["error"]["message"]) < 600 and "Traceback" not in answer["error"]["message"]


def test_token_prompts_past_the_context_and_the_chat_route_are_400(served):
    run, url, _, _ = served
    context = json.loads((run / "final" / "config.json").read_text())["max_position_embeddings"]
    body = {"model": run.name, "prompt": [[5, 6], [5] * (context + 1)], "max_tokens": 1, "prompt_logprobs": 2}
    status, answer = _post(url, "/v1/completions", json.dumps(body))
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert answer["error"]["message"].startswith("prompt[1]: This model's maximum context length")
    chat = {"model": run.name, "messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 2}
    status, answer = _post(url, "/v1/chat/completions", json.dumps(chat))
    assert status == 400 and answer["error"]["param"] == "prompt_logprobs", answer


def test_scoring_and_tokenize_need_the_key_and_refuse_bad_bodies(served):
    run, url, _, _ = served
    scoring = json.dumps({"model": run.name, "prompt": [5, 6, 7], "max_tokens": 1, "prompt_logprobs": 2})
    for path, body in (("/v1/completions", scoring), ("/tokenize", '{"prompt": "hi"}')):
        for key in (None, "wrong"):
            status, answer = _post(url, path, body, key=key)
            assert status == 401 and answer["error"]["code"] == "invalid_api_key", (path, answer)
    for body, param in (('{"prompt": 5}', "prompt"), ("{}", "prompt"), ('{"prompt": ["hi"]}', "prompt"),
                        ('{"prompt": "hi", "add_special_tokens": "no"}', "add_special_tokens"),
                        ('{"model": "other", "prompt": "hi"}', "model"), ("[1, 2]", None), ("not json", None)):
        status, answer = _post(url, "/tokenize", body)
        assert status in (400, 404) and answer["error"]["param"] == param, (body, answer)
    status, answer = _raw(url, b"POST /tokenize HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode()
                          + b"\r\nContent-Length: " + str(5 * 2**20).encode() + b"\r\n\r\n")
    assert status == 413, answer
    # And answered, in vLLM's shapes: the tokens of a text, the log-probs of a batch of token-id prompts.
    status, tokens = _post(url, "/tokenize", json.dumps({"model": run.name, "prompt": "The dog says"}))
    assert status == 200 and tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] > 0, tokens
    body = {"model": run.name, "prompt": [tokens["tokens"], tokens["tokens"][:2]], "max_tokens": 1, "prompt_logprobs": 3}
    status, answer = _post(url, "/v1/completions", json.dumps(body))
    assert status == 200 and [c["index"] for c in answer["choices"]] == [0, 1], answer
    first = answer["choices"][0]["prompt_logprobs"]
    assert first[0] is None and len(first) == len(tokens["tokens"])
    for t, entry in enumerate(first[1:], 1):
        ranks = sorted(v["rank"] for v in entry.values())
        assert ranks[:3] == [1, 2, 3] and str(tokens["tokens"][t]) in entry, entry  # the prompt's token is listed
        assert all(v["logprob"] <= 0 and isinstance(v["decoded_token"], str) for v in entry.values())
    assert answer["usage"]["prompt_tokens"] == len(tokens["tokens"]) + 2
