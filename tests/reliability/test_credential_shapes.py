"""Credentials are found by their shape, for the token families users paste: PyPI, GitLab, npm, Slack,
Stripe, Azure, Anthropic, Hugging Face, GitHub, OpenAI, AWS, Google, JWTs and private keys (and a few
more services' prefixed keys). A token in a recipe's free text never reaches a Kubernetes ConfigMap, a
job file, a printed recipe or a printed launch command; text that only resembles one is left alone.
(`serve` never printing its API key is in test_serve_refusals.py.)"""

from __future__ import annotations

import pytest
import yaml

from recipeforge.credentials import credential_kinds, redact_credentials
from surface_testing import recipeforge, refused

# Realistic shapes (made up, of the right length and alphabet), with the family each belongs to.
TOKENS = {
    "PyPI token": "pypi-AgEIcHlwaS5vcmcCJGExYjJjM2Q0LWU1ZjYtNzg5MC1hYmNkLWVmMTIzNDU2Nzg5MAACKlszLCJhYmNkZWZnaCJd",
    "GitLab token": "glpat-xT7bQ2mN9vR4kL8pW3sZ",
    "npm token": "npm_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z5A",
    "Slack token": "xoxb-1234567890123-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "Slack webhook": "https://hooks.slack.com/services/T0123ABCD/B0123ABCD/aBcDeFgHiJkLmNoPqRsTuVwX",
    "Stripe key": "sk_live_" + "51HxYz" * 4 + "AbCdEf",
    "Azure key": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "Zm9vYmFy" * 11 + "==",
    "Azure client secret": "Xk9" + "8Q~" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456",
    "Azure SAS signature": "https://acct.blob.core.windows.net/c/f.bin?sv=2022-11-02&sig=AbCdEfGhIjKlMnOp%2BqRsTuVwX%3D",
    "Anthropic API key": "sk-ant-api03-" + "AbCd_EfGh-" * 9 + "AA",
    "Hugging Face token": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456",
    "GitHub token": "ghp_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "OpenAI-style API key": "sk-proj-" + "AbCdEfGhIjKlMnOpQrSt" * 2,
    "AWS access key": "AKIAIOSFODNN7EXAMPL3",
    "AWS secret key": "aws secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "Google API key": "AIza" + "SyD-AbCdEfGhIjKlMnOpQrStUvWxYz01234",
    "Google OAuth token": "ya29.a0AfB_byC" + "AbCdEfGhIjKlMnOp" * 3,
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJlLXRoYXQtaXMtbG9uZw",
    "private key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n-----END OPENSSH PRIVATE KEY-----",
    "SendGrid key": "SG." + "AbCdEfGhIjKlMnOpQrStUv" + "." + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789AbCdEfG",
    "Replicate token": "r8_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789A",
    "Databricks token": "dapi" + "0123456789abcdef" * 2,
}
# Text that resembles a credential and is not one: left as it is.
ORDINARY = ["model.revision=0123456789abcdef0123456789abcdef01234567", "Qwen/Qwen2.5-7B-Instruct",
            "runs/sft-glpat-notes", "sk-learn", "checkpoint-600", "hooks.slack.com is down",
            "tokenizer_config.json", "train.learning_rate=1e-4", "npm_install_log"]


@pytest.mark.parametrize("kind", TOKENS)
def test_each_family_is_found_where_it_stands(kind):
    token = TOKENS[kind]
    text = f"run notes: {token} (pasted by mistake)"
    assert kind in credential_kinds(text)
    shown = redact_credentials(text)
    secret = token.partition("AccountKey=")[2] or token.partition("sig=")[2] or token
    assert secret[-12:] not in shown and "<redacted>" in shown, shown
    assert shown.startswith("run notes: ") and shown.endswith(" (pasted by mistake)")


@pytest.mark.parametrize("text", ORDINARY)
def test_text_that_only_resembles_one_is_kept(text):
    assert redact_credentials(text) == text


def test_no_command_writes_or_prints_a_pasted_token(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"instruction": "x", "input": "", "output": "y"}\n' * 4)
    tokens = list(TOKENS.values())
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "stage": "sft", "name": "shared-run", "description": "tokens: " + " ".join(tokens[:8]),
        "model": {"name_or_path": "tiny:llama"}, "hardware": {"gpus_per_node": 0},
        "data": {"datasets": [{"path": "rows.jsonl", "format": "alpaca"}]}}))

    def leaked(text: str) -> list[str]:
        return [t[:20] for t in tokens if t[-12:] in text]

    # The first report's case: a PyPI token in the description would have gone into the ConfigMap in clear.
    err = refused(recipeforge("launch", "--k8s", "r.yaml", "--image", "ghcr.io/acme/rf:1", "--pvc", "runs",
                              cwd=tmp_path), "cannot go into a ConfigMap", "description")
    assert not leaked(err)
    # Printed: the resolved recipe and the plan.
    for args in (["resolve", "r.yaml"], ["plan", "r.yaml", "--json"], ["validate", "r.yaml"]):
        done = recipeforge(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr.decode()
        assert not leaked(done.stdout.decode() + done.stderr.decode()), args
    # Overrides: refused for a job file, hidden in a printed launch command.
    for i, token in enumerate(tokens[8:]):
        override = f"description=note {token}"
        err = refused(recipeforge("launch", "--slurm", "r.yaml", override, cwd=tmp_path), "credential")
        assert not leaked(err), token[:12]
        if i % 4 == 0:  # a few printed dry runs (each is a process start)
            done = recipeforge("train", "r.yaml", override, "--nproc-per-node", "2", "--dry-run", cwd=tmp_path)
            assert done.returncode == 0, done.stderr.decode()[-2000:]
            assert not leaked(done.stdout.decode() + done.stderr.decode()), token[:12]
    assert not (tmp_path / "runs").exists()
