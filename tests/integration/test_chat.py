"""`recipeforge chat RUN_DIR` in a real terminal (a pty): a tiny LoRA run, its adapter loaded on the base
without merging; the streamed reply is the model's own greedy generation through the run's chat
template; /reset, a multi-line message and /exit work; a directory without final/ is exit 2."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path


def _read_until(fd: int, marker: bytes, buffer: bytearray, timeout: float = 120.0) -> bytes:
    """Read from the terminal until `marker` appears after what was consumed; return the text before it."""
    deadline = time.monotonic() + timeout
    while marker not in buffer:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} on the terminal; it shows: {bytes(buffer)[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            assert chunk or marker in buffer, f"the terminal closed; it showed: {bytes(buffer)[-2000:]!r}"
            buffer.extend(chunk)
    before, _, after = bytes(buffer).partition(marker)
    buffer[:] = after
    return before


def _greedy(run: Path, text: str, tokens: int) -> str:
    from recipeforge.tools.chat import load_chat_model

    model, tokenizer = load_chat_model(run, device="cpu")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    out = model.generate(input_ids=ids, attention_mask=ids.new_ones(ids.shape), do_sample=False,
                         max_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_chat_in_a_terminal(tiny, tmp_path):
    run = tiny.train("sft-lora", tmp_path / "run", "train.max_steps=2")
    assert (run / "final" / "adapter_config.json").is_file()
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "recipeforge", "chat", str(run), "--max-new-tokens", "6",
                             "--temperature", "0", "--device", "cpu"],
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True, cwd=tmp_path)
    os.close(slave)
    buffer = bytearray()
    try:
        _read_until(master, b">>> ", buffer)
        os.write(master, b"hello there\r")
        reply = _read_until(master, b">>> ", buffer).decode()
        os.write(master, b"/reset\r")
        assert b"conversation cleared" in _read_until(master, b">>> ", buffer)
        os.write(master, b'"""\rfirst line\rsecond line\r"""\r')
        _read_until(master, b">>> ", buffer)
        os.write(master, b"/exit\r")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    # the terminal echoes the message; the reply follows it on the next line
    streamed = reply.split("hello there", 1)[1].strip()
    assert streamed == _greedy(run, "hello there", 6).strip()


def test_chat_needs_a_finished_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "recipeforge", "chat", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "has no final/ model" in proc.stderr and "Traceback" not in proc.stderr
