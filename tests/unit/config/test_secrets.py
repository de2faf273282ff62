"""Values from secret-looking environment variables never appear in resolved output."""

import pytest

from recipeforge.cli import main
from recipeforge.config.secrets import is_secret_name
from rf_testing import MINIMAL


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("MLFLOW_TRACKING_PASSWORD", True),
    ("OPENAI_KEY", True), ("HUB_AUTH", True), ("RUN_SUFFIX", False), ("HOME", False), ("KEYBOARD", False),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_resolve_redacts_secret_env_values(write, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_s3cr3t_value")
    monkeypatch.setenv("RUN_SUFFIX", "plain")
    path = write("r.yaml", MINIMAL + "description: 'token ${env:HF_TOKEN}'\nname: 'run-${env:RUN_SUFFIX}'\n")
    assert main(["resolve", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hf_s3cr3t_value" not in out
    assert "description: '<redacted: ${env:HF_TOKEN}>'" in out
    assert "name: run-plain" in out
