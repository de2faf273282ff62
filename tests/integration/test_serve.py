"""`recipeforge serve RUN_DIR` answers the official `openai` client: a tiny LoRA run served on the
transformers engine (the adapter on its base, not merged); chat, streamed chat and completions equal
`transformers`' greedy generation for the same prompt; stop strings, the API key and the model name are
honoured; a directory without final/, a port in use and a missing engine are exit 2 with one line."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from serve_testing import start_serve

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
KEY = "sk-test-key"


def _greedy(run: Path, *, messages=None, prompt=None, tokens: int) -> str:
    from recipeforge.tools.chat import load_chat_model

    model, tokenizer = load_chat_model(run, device="cpu")
    if messages is not None:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(input_ids=ids, attention_mask=ids.new_ones(ids.shape), do_sample=False,
                         max_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory):
    run = tiny.train("sft-lora", tmp_path_factory.mktemp("serve") / "tiny-lora", "train.max_steps=4")
    assert (run / "final" / "adapter_config.json").is_file()
    server = start_serve(run, "--api-key", KEY)
    yield run, server.url
    server.stop()


def test_chat_and_streaming_answer_as_greedy_generation(served):
    run, url = served
    client = openai.OpenAI(base_url=url, api_key=KEY)
    assert [m.id for m in client.models.list()] == [run.name]
    messages = [{"role": "user", "content": "What does the cow say?"}]
    expected = _greedy(run, messages=messages, tokens=12)
    reply = client.chat.completions.create(model=run.name, messages=messages, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == expected
    assert reply.usage.completion_tokens <= 12 and reply.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model=run.name, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens


def test_completions_and_stop_strings(served):
    run, url = served
    client = openai.OpenAI(base_url=url, api_key=KEY)
    expected = _greedy(run, prompt="The dog says", tokens=10)
    got = client.completions.create(model=run.name, prompt="The dog says", max_tokens=10, temperature=0)
    assert got.choices[0].text == expected
    stop = expected[len(expected) // 2:len(expected) // 2 + 2]
    assert stop.strip(), expected
    cut = client.completions.create(model=run.name, prompt="The dog says", max_tokens=10, temperature=0, stop=[stop])
    assert cut.choices[0].text == expected[:expected.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=run.name, prompt="The dog says", max_tokens=10, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_the_key_and_the_model_name_are_checked(served):
    run, url = served
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=url, api_key=KEY).chat.completions.create(
            model="another-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        openai.OpenAI(base_url=url, api_key=KEY).chat.completions.create(
            model=run.name, messages=[{"role": "user", "content": "hi"}], temperature=7)


def _refused(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RECIPEFORGE_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "serve", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_bad_input_is_exit_2_with_one_line(served, tmp_path):
    run, _ = served
    assert "has no final/ model to serve" in _refused(str(tmp_path), "--engine", "transformers", cwd=tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = _refused(str(run), "--engine", "transformers", "--port", str(port), cwd=tmp_path)
        assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    if importlib.util.find_spec("vllm") is None:
        assert "needs vLLM" in _refused(str(run), "--engine", "vllm", cwd=tmp_path)
