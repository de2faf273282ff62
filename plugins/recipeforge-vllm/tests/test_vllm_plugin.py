"""recipeforge-vllm: the engine registers through its entry point, `grpo.rollout.options` is
validated with located errors, the arguments are TRL's, and the planner reserves vLLM's memory.

Needs the plugin installed (``pip install plugins/recipeforge-vllm``); the `gpu` test also needs
CUDA and vLLM.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from recipeforge.components.rollout import rollout_arguments, rollout_engines
from recipeforge.config import load_recipe
from recipeforge.errors import RecipeError

GRPO = """\
stage: grpo
model: {name_or_path: Qwen/Qwen2.5-0.5B}
hardware: {gpus_per_node: 1, gpu: H100-80GB}
data:
  datasets: [{path: prompts.jsonl, format: prompt}]
train: {global_batch_size: 8}
grpo:
  num_generations: 4
  rewards: [{name: length, args: {target: 8}}]
"""


def _load(tmp_path, rollout_yaml: str):
    path = tmp_path / "r.yaml"
    path.write_text(GRPO + rollout_yaml)
    return load_recipe(path)


def _problems(tmp_path, rollout_yaml: str) -> dict:
    with pytest.raises(RecipeError) as info:
        _load(tmp_path, rollout_yaml)
    return {p.key: p for p in info.value.problems}


@pytest.fixture
def vllm_installed(monkeypatch):
    """Pretend vLLM is installed (this environment has no vLLM); TRL's argument checks still run."""
    # TRL's generation module imports vLLM at import time when it looks installed: import it as it is first,
    # whichever test imports it first.
    import trl.generation.vllm_generation  # noqa: F401

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))


def test_registered_by_its_entry_point():
    entry = rollout_engines.entry("vllm")
    assert entry.source == "recipeforge-vllm" and entry.version == "0.1.0"
    assert entry.obj.modes == ("colocate", "server") and entry.obj.reserves_gpu_memory
    assert rollout_engines.names() == ["hf", "vllm"]


def test_options_are_validated_where_they_are_written(tmp_path):
    ps = _problems(tmp_path, "  rollout:\n    engine: vllm\n    options: {tensor_paralel_size: 2, model_impl: jax}\n")
    p = ps["grpo.rollout.options.tensor_paralel_size"]
    assert p.message == "unknown key 'tensor_paralel_size'" and p.hint == "did you mean 'tensor_parallel_size'?"
    assert p.location.line == 12
    assert ps["grpo.rollout.options.model_impl"].message == "must be one of vllm, transformers (got 'jax')"


def test_server_mode_needs_an_engine_that_has_one(tmp_path):
    ps = _problems(tmp_path, "  rollout: {engine: hf, mode: server}\n")
    assert "has no server mode" in ps["grpo.rollout.mode"].message and "vllm" in ps["grpo.rollout.mode"].hint
    recipe = _load(tmp_path, "  rollout: {engine: vllm, mode: server, server_url: 'http://gen:8000'}\n").recipe
    assert recipe.grpo.rollout.engine == "vllm"


def test_devices_vllm_has_no_build_for_are_refused():
    from recipeforge.config.schema import RolloutConfig

    with pytest.raises(RecipeError) as info:
        rollout_arguments(RolloutConfig(engine="vllm"), "mps")
    assert info.value.problems[0].key == "grpo.rollout.engine" and "engine: hf" in info.value.problems[0].hint


def test_server_mode_on_a_cpu_trainer_generates_through_a_rollout_function(tmp_path, vllm_installed):
    """TRL's server client pushes weights over NCCL: a CPU trainer hands TRL a rollout function."""
    from recipeforge.components.rollout import split_trainer_arguments
    from recipeforge_vllm.server_rollout import ServerRollout

    recipe = _load(tmp_path, "  rollout: {engine: vllm, mode: server, server_url: 'http://gen:8001/'}\n").recipe
    config, trainer = split_trainer_arguments(rollout_arguments(recipe.grpo.rollout, "cpu"))
    # TRL's truncated importance sampling, which the plugin turns on once the trainer is built
    assert config == {"use_vllm": False, "vllm_importance_sampling_correction": True,
                      "vllm_importance_sampling_mode": "token_truncate"}
    assert isinstance(trainer["rollout_func"], ServerRollout) and trainer["rollout_func"].base_url == "http://gen:8001"
    assert (trainer["rollout_func"].timeouts.generation_s, trainer["rollout_func"].timeouts.sync_s) == (1800, 600)


def test_asynchronous_grpo_runs_on_the_server_mode_only(tmp_path, vllm_installed):
    """`grpo.max_staleness` > 0: the server generates ahead, on CUDA as on a CPU; colocated vLLM is refused."""
    from recipeforge.components.rollout import split_trainer_arguments
    from recipeforge_vllm.async_rollout import AsyncServerRollout

    ps = _problems(tmp_path, "  max_staleness: 1\n  rollout: {engine: vllm, mode: colocate}\n")
    assert ps["grpo.max_staleness"].hint == "set grpo.rollout.mode: server, or grpo.max_staleness: 0"
    recipe = _load(tmp_path, "  max_staleness: 2\n  rollout: {engine: vllm, mode: server}\n").recipe
    for device in ("cuda", "cpu"):
        config, trainer = split_trainer_arguments(rollout_arguments(recipe.grpo.rollout, device, max_staleness=2))
        assert config == {"use_vllm": False, "vllm_importance_sampling_correction": True,
                          "vllm_importance_sampling_mode": "token_truncate"}
        rollout = trainer["rollout_func"]
        assert isinstance(rollout, AsyncServerRollout) and rollout.max_staleness == 2
        assert rollout.base_url == "http://127.0.0.1:8000"


class _Announced:
    """What the read-ahead loader tells a rollout: the prompts of each generation batch it reads."""

    def __init__(self):
        self.prompts: list = []

    def expect(self, prompts: list) -> None:
        self.prompts.append(prompts)


@pytest.mark.parametrize("depth", [1, 2])
def test_the_loader_announces_generation_batches_depth_steps_ahead(depth):
    """TRL repeats each generation batch once per accumulation step (here 2): the first of each pair is
    announced, and while the trainer takes batch k the batches of the next `depth` steps are known."""
    from recipeforge_vllm.async_rollout import LookAheadLoader

    steps = [[{"prompt": f"p{k}a"}, {"prompt": f"p{k}b"}] for k in range(5)]
    data = [batch for batch in steps for _ in range(2)]
    announced = _Announced()
    loader = LookAheadLoader(data, announced, every=2, depth=depth)
    assert len(loader) == 10
    taken = []
    for i, batch in enumerate(loader):
        taken.append(batch)
        step = i // 2
        assert len(announced.prompts) == min(5, step + 1 + depth), (i, announced.prompts)
    assert taken == data  # nothing reordered, nothing lost
    assert announced.prompts == [[f"p{k}a", f"p{k}b"] for k in range(5)]


def test_a_server_the_run_starts_is_not_checked_before_the_run(tmp_path):
    """Nothing answers at the free port yet: the run starts the server itself, after the checks."""
    import socket

    from recipeforge.components.rollout import starts_server
    from recipeforge.outputs.services import ServiceUnavailable, check_services

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    path = tmp_path / "r.yaml"
    for launch, checked in ((True, False), (False, True)):
        path.write_text(GRPO.replace("Qwen/Qwen2.5-0.5B", "tiny:llama") + f"  rollout: {{engine: vllm, mode: server, "
                        f"server_url: '{url}', options: {{launch: {str(launch).lower()}, server_timeout: 1}}}}\n")
        recipe = load_recipe(path).recipe
        assert starts_server(recipe.grpo.rollout) is launch
        if checked:
            with pytest.raises(ServiceUnavailable, match="generation server"):
                check_services(recipe)
        else:
            check_services(recipe)


def test_the_launched_server_command_is_what_trl_expects(tmp_path):
    from recipeforge_vllm import VLLMOptions
    from recipeforge_vllm.server import server_command

    rollout = _load(tmp_path, "  rollout: {engine: vllm, mode: server, gpu_memory_utilization: 0.2,"
                              " options: {launch: true, max_model_length: 512}}\n").recipe.grpo.rollout
    options = VLLMOptions.model_validate(rollout.options)
    cuda = server_command(rollout, options, "/m", "127.0.0.1", 8123, cuda=True)
    assert cuda[cuda.index("--port") + 1] == "8123" and cuda[cuda.index("--max-model-len") + 1] == "512"
    assert cuda[cuda.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert json.loads(cuda[cuda.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert "--gpu-memory-utilization" not in cuda  # vLLM's default on the server's own GPUs
    cpu = server_command(rollout, options, "/m", "127.0.0.1", 8123, cuda=False)
    assert "--weight-transfer-config" not in cpu and cpu[cpu.index("--gpu-memory-utilization") + 1] == "0.2"
    assert "--enforce-eager" not in cpu  # vLLM's compile and CUDA graphs unless asked
    eager = server_command(rollout, options.model_copy(update={"enforce_eager": True}), "/m", "127.0.0.1", 8123,
                           cuda=False)
    assert "--enforce-eager" in eager


@pytest.mark.parametrize("rollout", ["{mode: colocate", "{mode: server, server_url: 'http://gen:8000'"])
def test_enforce_eager_is_refused_where_the_run_does_not_start_the_server(tmp_path, rollout):
    """At `validate`, at the key; and by the engine's arguments, for a recipe that did not go through it."""
    from recipeforge.config.schema import RolloutConfig

    text = f"  rollout: {rollout}, engine: vllm, options: {{enforce_eager: true}}}}\n"
    p = _problems(tmp_path, text)["grpo.rollout.options.enforce_eager"]  # at validate, at the key
    assert "applies to a server the run starts" in p.message and "launch: true" in p.hint
    with pytest.raises(RecipeError, match="applies to a server the run starts") as info:
        rollout_arguments(RolloutConfig(engine="vllm", mode="colocate", options={"enforce_eager": True}), "cuda")
    assert info.value.problems[0].key == "grpo.rollout.options.enforce_eager"


def test_a_launched_server_must_be_on_this_machine(tmp_path):
    from recipeforge_vllm import VLLM_DEFAULT_URL
    from recipeforge_vllm.server import start_server

    rollout = _load(tmp_path, "  rollout: {engine: vllm, mode: server, server_url: 'http://gen-node:8000',"
                              " options: {launch: true}}\n").recipe.grpo.rollout
    with pytest.raises(RecipeError, match="names gen-node") as info:
        start_server(rollout, "/m", tmp_path / "log", default_url=VLLM_DEFAULT_URL)
    assert info.value.problems[0].key == "grpo.rollout.server_url"


def test_gpu_without_vllm_says_what_to_install(monkeypatch):
    from recipeforge.config.schema import RolloutConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(RecipeError, match="not installed") as info:
        rollout_arguments(RolloutConfig(engine="vllm"), "cuda")
    assert "recipeforge-vllm[vllm]" in info.value.problems[0].hint


def test_colocate_arguments_are_grpo_config_arguments(tmp_path, vllm_installed):
    from trl import GRPOConfig

    recipe = _load(tmp_path, "  rollout:\n    engine: vllm\n    gpu_memory_utilization: 0.4\n"
                             "    options: {tensor_parallel_size: 2, enable_sleep_mode: true}\n").recipe
    kwargs = rollout_arguments(recipe.grpo.rollout, "cuda")
    assert kwargs == {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.4,
                      "vllm_tensor_parallel_size": 2, "vllm_enable_sleep_mode": True, "vllm_model_impl": "vllm",
                      "vllm_importance_sampling_correction": True}
    config = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, **kwargs)
    assert config.use_vllm and config.vllm_gpu_memory_utilization == 0.4


def test_server_arguments(tmp_path, vllm_installed, monkeypatch):
    import trl.generation.vllm_generation as generation
    from trl import GRPOConfig

    monkeypatch.setattr(generation, "VLLMClient", generation.VLLMClient)  # restored after the test
    recipe = _load(tmp_path, "  rollout: {engine: vllm, mode: server, server_url: 'http://gen:8000/', timeout_s: 90,"
                             " options: {server_timeout: 600}}\n").recipe
    kwargs = rollout_arguments(recipe.grpo.rollout, "cuda")
    # TRL's trainer builds its server client with the recipe's deadlines.
    assert generation.VLLMClient.deadlines.generation_s == 90 and generation.VLLMClient.deadlines.sync_s == 600
    assert kwargs["vllm_mode"] == "server" and kwargs["vllm_server_base_url"] == "http://gen:8000"
    assert kwargs["vllm_server_timeout"] == 600 and "vllm_gpu_memory_utilization" not in kwargs
    assert GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, **kwargs).vllm_mode == "server"


def test_planner_reserves_the_colocated_engine(tmp_path):
    from recipeforge.plan import make_plan
    from recipeforge.plan.hardware import hardware_for

    recipe = _load(tmp_path, "  rollout: {engine: vllm, gpu_memory_utilization: 0.4}\n").recipe
    colocated = make_plan(recipe)
    gpu_gb = hardware_for(recipe, None).gpu_memory_gb
    assert colocated.memory_gb["rollout_engine"] == pytest.approx(0.4 * gpu_gb, rel=0.01)
    server = make_plan(_load(tmp_path, "  rollout: {engine: vllm, mode: server}\n").recipe)
    assert not server.memory_gb.get("rollout_engine")


@pytest.mark.gpu
def test_grpo_with_vllm_rollouts_on_gpu(tmp_path):
    pytest.importorskip("vllm")
    import torch

    from recipeforge.components.models import build_random_model
    from recipeforge.components.tokenizer import build_tiny_tokenizer
    from recipeforge.outputs.metrics import read_metrics
    from recipeforge.run import train

    # vLLM's attention kernels need a head size it supports (64): a small model saved to a directory.
    tok = build_tiny_tokenizer(1024)
    config = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "max_position_embeddings": 512, "tie_word_embeddings": False}
    model = build_random_model(config, tok, name="tiny-vllm", seed=0, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    rows = [{"prompt": f"Say {w}:", "answer": w} for w in ("moo", "woof", "meow", "baa")] * 8
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""\
stage: grpo
model: {{name_or_path: {tmp_path / 'model'}, dtype: bf16}}
hardware: {{gpus_per_node: 1}}
data: {{datasets: [{{path: prompts.jsonl, format: prompt}}], sequence_len: 64}}
train: {{max_steps: 3, global_batch_size: 8, learning_rate: 1.0e-3, logging_steps: 1}}
grpo:
  num_generations: 4
  max_completion_length: 16
  rewards: [{{name: length, args: {{target: 8}}}}]
  rollout: {{engine: vllm, mode: colocate, gpu_memory_utilization: 0.2, options: {{max_model_length: 256}}}}
output: {{dir: {tmp_path / 'run'}}}
logging: {{progress_bar: false}}
""")
    run = train(load_recipe(recipe), overwrite=True)
    rewards = [r["reward"] for r in read_metrics(run / "metrics.jsonl") if r.get("reward") is not None]
    assert len(rewards) == 3 and (run / "final").is_dir()


def _health_server(status: int):
    """A local HTTP server answering `status` on every path (a generation server, up or broken)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_server_mode_checks_the_server_before_the_run(tmp_path):
    """Server mode: the generation server must answer /health before anything starts; a wrong URL is a
    located user error after `server_timeout` seconds of waiting, its credentials hidden."""
    import socket

    from recipeforge.outputs.services import ServiceUnavailable, check_services

    def _load(tmp_path, rollout_yaml: str):  # a built-in model: only the generation server is a service
        path = tmp_path / "r.yaml"
        path.write_text(GRPO.replace("Qwen/Qwen2.5-0.5B", "tiny:llama") + rollout_yaml)
        return load_recipe(path)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loaded = _load(tmp_path, f"  rollout: {{engine: vllm, mode: server, server_url: 'http://u:pw1234@127.0.0.1:{port}',"
                             f" options: {{server_timeout: 1}}}}\n")
    with pytest.raises(ServiceUnavailable) as info:
        check_services(loaded.recipe, loaded.tree.locate)
    (problem,) = info.value.problems
    assert problem.key == "grpo.rollout.server_url" and problem.location.line == 10
    assert f"the vllm generation server at http://u:***@127.0.0.1:{port} is unreachable" in problem.message
    assert "pw1234" not in info.value.render() and "server_timeout" in problem.hint
    for status, ok in ((200, True), (503, False)):
        server = _health_server(status)
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            loaded = _load(tmp_path, f"  rollout: {{engine: vllm, mode: server, server_url: '{url}'}}\n")
            if ok:
                check_services(loaded.recipe, loaded.tree.locate)
            else:
                with pytest.raises(ServiceUnavailable, match="answered HTTP 503 at /health"):
                    check_services(loaded.recipe, loaded.tree.locate)
        finally:
            server.shutdown()
            server.server_close()


def _silent_server():
    """A socket that accepts connections and never answers (a hung generation server)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    return listener


def test_a_server_that_does_not_answer_is_an_error_naming_it_within_the_timeout():
    import time

    from recipeforge_vllm.deadline import GENERATION, SYNC, ServerTimeouts, bounded_session, what_of

    listener = _silent_server()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        assert what_of(url + "/v1/completions") == GENERATION and what_of(url + "/collective_rpc") == SYNC
        timeouts = ServerTimeouts(url, generation_s=2.0, sync_s=1.0)
        for path, what, seconds, key in (("/v1/completions", "generation", 2.0, "grpo.rollout.timeout_s"),
                                         ("/update_weights", "weight sync", 1.0, "grpo.rollout.sync_timeout_s")):
            started = time.monotonic()
            with pytest.raises(RecipeError) as info:
                bounded_session(timeouts).post(url + path, json={})
            took = time.monotonic() - started
            assert seconds <= took < seconds + 2, took
            problem = info.value.problems[0]
            assert problem.key == key and url in problem.message and f"did not answer within {seconds:g} s" in \
                problem.message and f"during {what}" in problem.message and "resume" in problem.hint
    finally:
        listener.close()


def test_a_server_that_refuses_connections_is_an_error_within_the_timeout():
    import socket
    import time

    from recipeforge_vllm.deadline import ServerTimeouts, bounded_session

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(RecipeError) as info:
        bounded_session(ServerTimeouts(url, generation_s=3.0, sync_s=3.0, section="rloo")).post(url + "/v1/completions")
    assert time.monotonic() - started < 3.0 + 2
    problem = info.value.problems[0]
    assert problem.key == "rloo.rollout.timeout_s" and "refused the connection" in problem.message


def test_an_answer_in_time_is_returned():
    from recipeforge_vllm.deadline import ServerTimeouts, bounded_session

    server = _health_server(200)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert bounded_session(ServerTimeouts(url, generation_s=5, sync_s=5)).get(url + "/health").status_code == 200
    finally:
        server.shutdown()


def test_a_blocked_transfer_ends_the_process_with_exit_2():
    """An NCCL transfer cannot be interrupted: past its deadline the process ends, naming the server."""
    import subprocess
    import sys
    import time

    code = ("import time\n"
            "from recipeforge_vllm import deadline\n"
            "deadline.HARD_GRACE_S = 0\n"
            "t = deadline.ServerTimeouts('http://gen:8000', generation_s=60, sync_s=1)\n"
            "with deadline.hard_deadline(t, deadline.SYNC):\n"
            "    time.sleep(60)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and time.monotonic() - started < 30
    assert "http://gen:8000" in done.stderr and "weight sync" in done.stderr and "sync_timeout_s" in done.stderr
    assert "Traceback" not in done.stderr
