"""External services as user errors: a tracker server, the Hub or a generation server that is
unreachable, refuses the credentials or does not answer stops `recipeforge train` with exit 2 and one
located line naming the service, before the run directory exists; credentials never reach a message or
a file. A service that fails once training runs costs no checkpoint: trackers stop logging with a
warning, a failed push leaves the finished run on disk (exit 3).

The services are real HTTP servers on this machine (`service_testing`) answering as a broken service
would; the command runs as a user types it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service_testing import Endpoint, Reply, closed_port, serving

REPO = Path(__file__).resolve().parents[2]
LORA = REPO / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
PASSWORD = "s3cretPassw0rd"
HF_TOKEN = "hf_" + "Q7" * 17
WANDB_KEY = "0123456789abcdef" * 2 + "01234567"


def _train(tmp_path: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf-home"), "NETRC": str(tmp_path / "netrc"),
            "RECIPEFORGE_SERVICE_TIMEOUT": "2", **env}
    for name in ("HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_URI", "WANDB_BASE_URL"):
        if name not in env:
            full.pop(name, None)
    (tmp_path / "netrc").write_text("")
    return subprocess.run([sys.executable, "-m", "recipeforge", "train", str(LORA), f"output.dir={tmp_path / 'run'}",
                           "train.max_steps=4", "output.save_steps=2", "logging.progress_bar=false", *overrides],
                          capture_output=True, text=True, cwd=tmp_path, env=full, timeout=600)


def _refused(proc: subprocess.CompletedProcess, tmp_path: Path, *expected: str) -> str:
    """Exit 2, one `error:` line holding `expected`, no traceback, no secret, no run directory."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for text in expected:
        assert text in errors[0], errors[0]
    assert "Traceback" not in proc.stderr
    for secret in (PASSWORD, HF_TOKEN, WANDB_KEY):
        assert secret not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written
    return errors[0]


# ----------------------------------------------------------------------------- MLflow

@pytest.mark.requires_mlflow
def test_mlflow_unreachable_with_credentials_in_the_uri(tmp_path):
    uri = f"http://alice:{PASSWORD}@127.0.0.1:{closed_port()}/"
    line = _refused(_train(tmp_path, f"logging.mlflow.tracking_uri={uri}"), tmp_path,
                    "logging.mlflow.tracking_uri: MLflow tracking server at http://alice:***@127.0.0.1",
                    "is unreachable: connection refused")
    assert str(LORA) not in line or ":" in line  # located at the override that named it
    assert "<cli logging.mlflow.tracking_uri=" in line


@pytest.mark.requires_mlflow
def test_mlflow_refusing_the_credentials(tmp_path):
    with serving(Endpoint(default=Reply(401, b'{"error_code": "UNAUTHENTICATED"}'))) as server:
        proc = _train(tmp_path, f"logging.mlflow.tracking_uri={server.url}", MLFLOW_TRACKING_USERNAME="alice",
                      MLFLOW_TRACKING_PASSWORD=PASSWORD)
        _refused(proc, tmp_path, "MLflow tracking server at http://127.0.0.1", "refused the credentials (HTTP 401)")
        (_, _, headers), = server.seen
        assert headers["Authorization"].startswith("Basic ")  # the environment's credentials were offered


@pytest.mark.requires_mlflow
def test_mlflow_not_answering_in_time(tmp_path):
    with serving(Endpoint(default=Reply(200, hang_s=5))) as server:
        # The URI from the environment, as MLflow itself reads it.
        proc = _train(tmp_path, "logging.mlflow.experiment=tiny",
                      MLFLOW_TRACKING_URI=server.url.replace("http://", f"http://bob:{PASSWORD}@"),
                      RECIPEFORGE_SERVICE_TIMEOUT="1")
        line = _refused(proc, tmp_path, "did not answer within 1 s")
        assert "http://bob:***@127.0.0.1" in line and "logging.mlflow" in line


@pytest.mark.requires_mlflow
def test_mlflow_failing_mid_run_costs_no_checkpoint(tmp_path):
    """The server answers the check, then fails every request of the run: training goes on."""
    routes = {("GET", "/api/2.0/mlflow/experiments/get-by-name"):
              Reply(404, b'{"error_code": "RESOURCE_DOES_NOT_EXIST"}')}
    with serving(Endpoint(routes=routes, default=Reply(500, b'{"error_code": "INTERNAL_ERROR"}'))) as server:
        uri = server.url.replace("http://", f"http://alice:{PASSWORD}@")
        proc = _train(tmp_path, f"logging.mlflow.tracking_uri={uri}", "train.logging_steps=1",
                      MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: MLflow stopped logging" in proc.stderr and "metrics.jsonl keeps every record" in proc.stderr
    run = tmp_path / "run"
    assert (run / "final" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["checkpoint-2", "checkpoint-4"]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert not [p for p in run.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="refuses only where mlflow is not installed")
def test_mlflow_not_installed_is_refused_before_the_model_loads(tmp_path):
    line = _refused(_train(tmp_path, "logging.mlflow.experiment=tiny"), tmp_path,
                    "logging.mlflow needs the mlflow package, which is not installed")
    assert "<cli logging.mlflow.experiment=tiny>" in line


# ----------------------------------------------------------------------------- W&B

def test_wandb_online_without_an_api_key(tmp_path):
    _refused(_train(tmp_path, "logging.wandb.project=p", WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}"),
             tmp_path, "logging.wandb.mode: W&B at http://127.0.0.1", "needs an API key, and none is set")


def test_wandb_refusing_the_api_key(tmp_path):
    with serving(Endpoint(default=Reply(401, b'{"errors": ["unauthorized"]}'))) as server:
        _refused(_train(tmp_path, "logging.wandb.project=p", WANDB_BASE_URL=server.url, WANDB_API_KEY=WANDB_KEY),
                 tmp_path, "W&B at http://127.0.0.1", "refused the credentials (HTTP 401)")


def test_wandb_unreachable(tmp_path):
    _refused(_train(tmp_path, "logging.wandb.project=p", WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}",
                    WANDB_API_KEY=WANDB_KEY), tmp_path, "W&B at http://127.0.0.1", "is unreachable")


# ----------------------------------------------------------------------------- the Hub

def test_push_to_hub_offline_or_without_a_token_is_refused_up_front(tmp_path):
    _refused(_train(tmp_path, "output.push_to_hub.repo_id=me/tiny", HF_HUB_OFFLINE="1"), tmp_path,
             "output.push_to_hub: the Hugging Face Hub", "offline mode is on (HF_HUB_OFFLINE=1)")
    _refused(_train(tmp_path, "output.push_to_hub.repo_id=me/tiny", HF_HUB_OFFLINE="0"), tmp_path,
             "the Hugging Face Hub", "needs a token, and none is set")


def test_push_to_hub_with_a_refused_or_read_only_token(tmp_path):
    with serving(Endpoint(default=Reply(401, b'{"error": "Invalid credentials"}'))) as server:
        _refused(_train(tmp_path, "output.push_to_hub.repo_id=me/tiny", HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN,
                        HF_ENDPOINT=server.url), tmp_path, f"the Hugging Face Hub at {server.url}",
                 "refused the credentials (HTTP 401)")
    whoami = json.dumps({"name": "me", "auth": {"accessToken": {"role": "read"}}}).encode()
    with serving(Endpoint(routes={("GET", "/api/whoami-v2"): Reply(200, whoami)})) as server:
        _refused(_train(tmp_path, "output.push_to_hub.repo_id=me/tiny", HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN,
                        HF_ENDPOINT=server.url), tmp_path, "for reading only; a push needs a write token")


@pytest.mark.slow
def test_push_failing_after_training_keeps_the_run_and_exits_3(tmp_path):
    whoami = json.dumps({"name": "me", "auth": {"accessToken": {"role": "write"}}}).encode()
    with serving(Endpoint(routes={("GET", "/api/whoami-v2"): Reply(200, whoami)},
                          default=Reply(500, b'{"error": "down"}'))) as server:
        proc = _train(tmp_path, "output.push_to_hub.repo_id=me/tiny", HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN,
                      HF_ENDPOINT=server.url)
    assert proc.returncode == 3, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert (run / "merged" / "model.safetensors").is_file() and (run / "checkpoints" / "checkpoint-4").is_dir()
    assert f"then retry: recipeforge push {run} --repo-id me/tiny" in proc.stderr
    assert HF_TOKEN not in proc.stdout + proc.stderr
    assert not [p for p in run.rglob("*") if p.is_file() and HF_TOKEN.encode() in p.read_bytes()]
    # The retry reads the repository from the run's recipe.
    again = subprocess.run([sys.executable, "-m", "recipeforge", "push", str(run), "--dry-run"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=120)
    assert again.returncode == 0 and f"model.safetensors\t{run / 'merged' / 'model.safetensors'}" in again.stdout


def test_a_hub_model_that_is_not_cached_needs_a_reachable_hub(tmp_path):
    # A model the planner sizes from its own table, so only the download needs the Hub.
    model = ("model.name_or_path=Qwen/Qwen2.5-0.5B", "~adapter.modules_to_save")
    offline = _train(tmp_path, *model, HF_HUB_OFFLINE="1")
    line = _refused(offline, tmp_path, "model.name_or_path: the Hugging Face Hub (model Qwen/Qwen2.5-0.5B)",
                    "not in the cache here and offline mode is on")
    assert "hf download Qwen/Qwen2.5-0.5B" in offline.stderr  # the same run's hint, not a second run's
    _refused(_train(tmp_path, *model, HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}"),
             tmp_path, "is unreachable: connection refused")
    with serving(Endpoint(default=Reply(401, b'{"error": "gated"}'))) as server:
        _refused(_train(tmp_path, *model, HF_HUB_OFFLINE="0", HF_TOKEN=HF_TOKEN, HF_ENDPOINT=server.url), tmp_path,
                 "refused access: the repository is gated, private or does not exist, and the token has no access")
        ((method, path, headers),) = server.seen
        assert method == "HEAD" and path == "/Qwen/Qwen2.5-0.5B/resolve/main/config.json"
        assert headers["Authorization"] == f"Bearer {HF_TOKEN}"
    assert line
