"""A `vllm serve` process the run starts for GRPO server mode (``options.launch: true``).

The server runs on the machine of the run's main process, at the address of
`grpo.rollout.server_url` (default ``http://127.0.0.1:8000``), with what TRL's trainer expects of
it: processed log-probabilities (importance sampling), unlimited log-probabilities, and on CUDA
the NCCL weight-transfer engine TRL pushes the trained weights through. vLLM's development
endpoints are on (``VLLM_SERVER_DEV_MODE``): the prefix-cache reset, and the in-place reload a
CPU run syncs its weights with. Its output goes to the run's ``logs/rollout_server.log``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from recipeforge.errors import RecipeError

LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")


class ServerProcess:
    """A started server: its URL, and `stop` (SIGTERM to its process group, then SIGKILL)."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path):
        self.process, self.url, self.log_path = process, url, log_path

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the server and every process it started (vLLM's engine core runs in a child)."""
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def server_command(rollout, options, model_path: str, host: str, port: int, *, cuda: bool) -> list[str]:
    """The `vllm serve` command line for `grpo.rollout` (engine vllm, server mode)."""
    command = [*_serve_entry(model_path),
               "--host", host, "--port", str(port), "--model-impl", options.model_impl,
               "--tensor-parallel-size", str(options.tensor_parallel_size),
               # TRL's importance sampling reads the sampled tokens' log-probabilities after
               # temperature and logit processing; distillation asks for more than 20.
               "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    if options.max_model_length:
        command += ["--max-model-len", str(options.max_model_length)]
    share = options.server_gpu_memory_utilization
    if share is None and not cuda:
        # On a CPU the flag is the share of host memory vLLM reserves, and the trainer shares the host.
        share = rollout.gpu_memory_utilization
    if share is not None:
        command += ["--gpu-memory-utilization", str(share)]
    if options.enforce_eager:
        command.append("--enforce-eager")
    if cuda:  # TRL's trainer pushes weights through vLLM's NCCL weight-transfer engine
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return command


def _serve_entry(model_path: str) -> list[str]:
    """`vllm serve MODEL` as `recipeforge serve` starts it (the CPU build needs its module's entry)."""
    from recipeforge.components.rollout import vllm_serve_argv

    return vllm_serve_argv(model_path)


def _address(rollout, default_url: str) -> tuple[str, str, int]:
    url = (rollout.server_url or default_url).rstrip("/")
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if host not in LOCAL_HOSTS and host not in (socket.gethostname(), socket.getfqdn()):
        raise RecipeError(f"the run starts the generation server on this machine, but grpo.rollout.server_url "
                          f"names {host}", key="grpo.rollout.server_url",
                          hint="leave server_url out (127.0.0.1:8000), name this machine, or set "
                               "grpo.rollout.options.launch: false and start the server there")
    return url, host, parsed.port or 8000


def _stop_with_parent() -> None:
    """In the server's process, before it runs: on Linux, have the kernel send it SIGTERM when the
    run that started it dies, even by SIGKILL (no atexit runs then), so no server outlives its run
    holding the port and the memory. vLLM stops its engine processes on SIGTERM."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_server(rollout, model_path: str, log_path: Path, *, default_url: str) -> ServerProcess:
    """Start `vllm serve` for the policy at `model_path` and wait until it answers on /health."""
    import torch

    from recipeforge_vllm import VLLMOptions

    options = VLLMOptions.model_validate(dict(rollout.options or {}))
    url, host, port = _address(rollout, default_url)
    if _answers(url):
        raise RecipeError(f"a server already answers at {url}; the run would not own the server it generates with",
                          key="grpo.rollout.server_url",
                          hint="stop it, pick a free port in server_url, or set grpo.rollout.options.launch: false "
                               "to use it")
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    if options.server_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = options.server_devices
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if Path(model_path).is_dir():  # a local model: the server may run from another directory
        model_path = str(Path(model_path).resolve())
    command = server_command(rollout, options, model_path, host, port, cuda=torch.cuda.is_available())
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   preexec_fn=_stop_with_parent)
    server = ServerProcess(process, url, log_path)
    deadline = time.monotonic() + options.server_timeout
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            what = (f"exited with status {process.returncode}" if process.poll() is not None
                    else f"did not answer within {options.server_timeout:g} s")
            server.stop()
            raise RecipeError(f"the vllm server the run started {what}; its output is in {log_path}",
                              key="grpo.rollout.options",
                              hint=f"last lines:\n{_tail(log_path)}")
        time.sleep(1.0)
    return server


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
