"""`recipeforge serve RUN --engine vllm` on vLLM's CPU build, as a user types it: a tiny LoRA run's
adapter is served as an adapter on its base (not merged), beside the base, and answers the official
`openai` client (chat, streamed) with peft's own greedy generation."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]
SFT_LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
KEY = "sk-serve-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lora_run(model_dir, tmp_path_factory) -> Path:
    """The tiny SFT LoRA recipe on the vLLM-sized model, adapters only (nothing trained in full)."""
    run = tmp_path_factory.mktemp("serve") / "tiny-adapter"
    cmd = [sys.executable, "-m", "recipeforge", "train", str(SFT_LORA), f"model.name_or_path={model_dir}",
           "adapter.modules_to_save=[]", "model.dtype=bf16", "train.max_steps=6", "output.merge_adapter=false",
           "data.val_size=0", f"output.dir={run}", "logging.progress_bar=false"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=run.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run / "final" / "adapter_config.json").is_file()
    return run


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 420) -> None:
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vllm serve ended early:\n{log.read_text()[-4000:]}"
        try:
            client.models.list()
            return
        except openai.APIConnectionError:
            time.sleep(2)
    raise AssertionError(f"vllm serve did not answer in {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def _peft_greedy(run: Path, messages: list[dict], tokens: int) -> str:
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    model = AutoPeftModelForCausalLM.from_pretrained(str(run / "final"), dtype=torch.bfloat16)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    out = model.generate(input_ids=ids, attention_mask=ids.new_ones(ids.shape), do_sample=False,
                         max_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_the_adapter_is_served_by_vllm_and_answers_like_peft(lora_run, tmp_path):
    port, log = _free_port(), tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "recipeforge", "serve", str(lora_run), "--engine", "vllm",
                                 "--port", str(port), "--gpu-memory-utilization", "0.1", "--api-key", KEY],
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait(url, proc, log)
        client = openai.OpenAI(base_url=url, api_key=KEY)
        assert {m.id for m in client.models.list()} == {lora_run.name, f"{lora_run.name}-base"}
        messages = [{"role": "user", "content": "What does the cow say?"}]
        reply = client.chat.completions.create(model=lora_run.name, messages=messages, max_tokens=8, temperature=0)
        base = client.chat.completions.create(model=f"{lora_run.name}-base", messages=messages, max_tokens=8,
                                              temperature=0)
        assert reply.choices[0].message.content != base.choices[0].message.content  # the adapter is applied
        assert reply.choices[0].message.content == _peft_greedy(lora_run, messages, 8)
        streamed = client.chat.completions.create(model=lora_run.name, messages=messages, max_tokens=8,
                                                  temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
            reply.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="wrong").models.list()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
