"""Credentials written into a recipe (a URL's password, a key named like a token or a password) are
redacted wherever the recipe is printed or written: `resolve`, `plan` (text and JSON), `validate`,
error messages, resolved_recipe.yaml and the model card. Training itself gets the real value."""

from __future__ import annotations

import pytest

from hostile_testing import OK, assert_refused, run_inprocess, run_process, write_files
from recipeforge.config import load_recipe
from recipeforge.config.dump import dump_recipe, resolved_data
from recipeforge.config.secrets import REDACTED, has_redactions, redact_literals
from recipeforge.credentials import is_secret_key, redact_credentials
from recipeforge.outputs.run_guard import recipe_hash

PW = "pw-S3cr3t-4-tests"


@pytest.mark.parametrize("text, shown", [
    (f"http://user:{PW}@host", "http://user:***@host"),
    (f"https://user:{PW}@host:8443/path?q=1", "https://user:***@host:8443/path?q=1"),
    (f"https://{PW}@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    (f"postgresql+psycopg2://admin:{PW}@db.internal:5432/mlflow", "postgresql+psycopg2://admin:***@db.internal:5432/mlflow"),
    (f"see s3://key:{PW}@bucket/x and http://a:{PW}@b", "see s3://key:***@bucket/x and http://a:***@b"),
    (f"HTTP://USER:{PW}@HOST", "HTTP://USER:***@HOST"),
])
def test_url_userinfo_is_redacted(text, shown):
    assert redact_credentials(text) == shown


@pytest.mark.parametrize("text", ["mail me: someone@example.com", "org/model@main", "http://host/a@b", "tiny:llama"])
def test_text_without_credentials_is_unchanged(text):
    assert redact_credentials(text) == text


HF = "hf_" + "AbCdEfGh1234" * 3
SHAPED = [
    pytest.param(f"my run, token {HF}", HF, id="hugging-face"),
    pytest.param("key sk-proj-" + "Xy9_" * 10, "sk-proj-" + "Xy9_" * 10, id="openai-project"),
    pytest.param("sk-ant-api03-" + "k" * 40, "sk-ant-api03-" + "k" * 40, id="anthropic-style"),
    pytest.param("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", id="aws-access-key-id"),
    pytest.param("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                 "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", id="aws-secret-by-its-key"),
    pytest.param("gcp AIza" + "B" * 35, "AIza" + "B" * 35, id="google-api-key"),
    pytest.param("ghp_" + "a1" * 18, "ghp_" + "a1" * 18, id="github"),
    pytest.param("wandb key " + "0123456789abcdef" * 2 + "01234567", "0123456789abcdef" * 2 + "01234567",
                 id="wandb-40-hex-next-to-its-name"),
    pytest.param("key " + "aZ9" * 28 + "xy", "aZ9" * 28 + "xy", id="wandb-86-characters"),
    pytest.param("local-" + "ab" * 20, "ab" * 20, id="wandb-on-prem"),
    pytest.param("Authorization: Bearer abc.DEF-ghi_123", "abc.DEF-ghi_123", id="bearer"),
    pytest.param("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
                 "eyJhbGciOiJIUzI1NiJ9", id="jwt"),
    pytest.param("https://h/x?access_token=abcdefgh123&y=1", "abcdefgh123", id="query-parameter"),
    pytest.param("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow",
                 id="private-key-block"),
]


@pytest.mark.parametrize("text, secret", SHAPED)
def test_credentials_are_found_by_their_shape(text, secret):
    shown = redact_credentials(text)
    assert secret not in shown and "<redacted>" in shown


@pytest.mark.parametrize("text", [
    "revision 0123456789abcdef0123456789abcdef01234567",  # a git commit id, not a key
    "/hub/models--org--m/snapshots/0123456789abcdef0123456789abcdef01234567/config.json",
    "pad_token: <|endoftext|>", "eos_token=<|im_end|>", "max_new_tokens: 123456", "num_tokens=1234567",
    "tokenizer: meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
    "sk-short", "hf_tiny", "A" * 120, "checkpoint-1200", "runs/qlora-70b-2026-11-25",
])
def test_look_alikes_are_left_alone(text):
    assert redact_credentials(text) == text


@pytest.mark.parametrize("key, secret", [
    ("hf_token", True), ("token", True), ("hub_token", True), ("access_token", True), ("api_key", True),
    ("apikey", True), ("wandb_api_key", True), ("password", True), ("db_passwd", True), ("client_secret", True),
    ("credentials", True), ("AWS_SECRET_ACCESS_KEY", True), ("logging.mlflow.password", True),
    ("tokenizer", False), ("max_tokens", False), ("pad_token", False), ("pad_token_id", False),
    ("tracking_uri", False), ("name", False),
])
def test_secret_key_names(key, secret):
    assert is_secret_key(key) is secret


def test_redact_literals_walks_everything():
    data = {"a": {"hf_token": PW, "tokenizer": "gpt2", "n": [f"http://u:{PW}@h", {"password": 5}]},
            "api_key": None, "secret": "<redacted: ${env:X}>"}
    out = redact_literals(data)
    assert out == {"a": {"hf_token": REDACTED, "tokenizer": "gpt2", "n": ["http://u:***@h", {"password": REDACTED}]},
                   "api_key": None, "secret": "<redacted: ${env:X}>"}
    assert data["a"]["hf_token"] == PW  # a copy


URI = f"logging.mlflow.tracking_uri=http://user:{PW}@mlflow.internal:5000"
CLI_CASES = [
    pytest.param(["resolve", "r.yaml", URI], "http://user:***@mlflow.internal:5000", id="resolve-tracking-uri"),
    pytest.param(["resolve", "r.yaml", f"description=docs at https://me:{PW}@wiki/x"], "https://me:***@wiki/x",
                 id="resolve-description"),
    pytest.param(["resolve", "r.yaml", f"kernels.liger.api_key={PW}"], "api_key: <redacted>", id="resolve-api-key"),
    pytest.param(["resolve", "r.yaml", f"kernels.liger.hf_token={PW}"], "hf_token: <redacted>", id="resolve-token"),
    pytest.param(["resolve", "r.yaml", f"kernels.liger.options={{password: {PW}}}"], "password: <redacted>",
                 id="resolve-nested-password"),
    pytest.param(["plan", "r.yaml", URI], "Plan:", id="plan-text"),
    pytest.param(["plan", "r.yaml", URI, "--json"], '"backend"', id="plan-json"),
    pytest.param(["validate", "r.yaml", f"model.name_or_path=https://u:{PW}@hub/tiny"], None, id="validate-model-url"),
    pytest.param(["train", "r.yaml", URI, "--dry-run", "--nproc-per-node", "2"], "# command", id="train-dry-run"),
]


# kernels.liger takes free-form options while no plugin defines them (the recipeforge-liger plugin, when
# installed, checks its own keys first): the built-ins alone here.
@pytest.mark.usefixtures("builtins_only")
@pytest.mark.parametrize("args, expected", CLI_CASES)
def test_credentials_never_printed(tmp_path, monkeypatch, capsys, args, expected):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_inprocess(capsys, args)
    assert PW not in out + err
    if expected is not None:
        assert code == 0, err
        assert expected in out


ERROR_CASES = [
    pytest.param([f"train.seed=http://user:{PW}@host"], "<cli train.seed=http://user:***@host>", id="wrong-type"),
    pytest.param([URI, "train.seed=x"], "<cli train.seed=x>", id="other-error"),
    pytest.param([f"hub_token={PW}"], "<cli hub_token=***>", id="unknown-secret-key"),
    pytest.param([f"train.password={PW}"], "<cli train.password=***>", id="unknown-nested-secret-key"),
    pytest.param([f"logging.mlflow.tracking_uri=http://u:{PW}@h", "logging.mlflow.experiment=[1]"],
                 "<cli logging.mlflow.experiment=[1]>", id="sibling-error"),
    pytest.param([f"model.name_or_path=http://u:{PW}@h/" + "x" * 200, "train.seed=[1, [2]]"], "<cli ",
                 id="long-url"),
]


@pytest.mark.parametrize("overrides, where", ERROR_CASES)
def test_credentials_never_in_error_messages(tmp_path, monkeypatch, capsys, overrides, where):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_inprocess(capsys, ["validate", "r.yaml", *overrides])
    assert_refused(code, err, where, "")
    assert PW not in out + err


def test_credential_in_a_file_value_error(tmp_path, monkeypatch, capsys):
    write_files(tmp_path, {"r.yaml": OK + f"train: {{seed: 'http://u:{PW}@host'}}\n"})
    monkeypatch.chdir(tmp_path)
    code, out, err = run_inprocess(capsys, ["validate", "r.yaml"])
    assert_refused(code, err, "r.yaml:8:9 train.seed", "http://u:***@host")
    assert PW not in err


@pytest.mark.parametrize("args", [
    ["resolve", "r.yaml", URI], ["plan", "r.yaml", URI, "--json"], ["validate", "r.yaml", URI, "train.seed=x"],
], ids=["resolve", "plan-json", "error"])
def test_credentials_through_the_cli(tmp_path, args):
    write_files(tmp_path, {"r.yaml": OK})
    code, out, err = run_process(tmp_path, args)
    assert code in (0, 2), err
    assert "Traceback" not in err and PW not in out + err


def test_resolve_to_file_and_the_real_value_stays(tmp_path, monkeypatch, capsys):
    write_files(tmp_path, {"r.yaml": OK})
    monkeypatch.chdir(tmp_path)
    code, _, err = run_inprocess(capsys, ["resolve", "r.yaml", URI, "-o", "out.yaml"])
    assert code == 0, err
    written = (tmp_path / "out.yaml").read_text()
    assert PW not in written and "tracking_uri: http://user:***@mlflow.internal:5000" in written
    # What trains is the real value; only what is written is redacted.
    loaded = load_recipe(tmp_path / "r.yaml", [URI], environ={})
    assert loaded.recipe.logging.mlflow.tracking_uri == f"http://user:{PW}@mlflow.internal:5000"
    assert PW not in dump_recipe(loaded) and has_redactions(loaded)
    assert not has_redactions(load_recipe(tmp_path / "r.yaml", [], environ={}))


def test_run_guard_compares_credentials_redacted(tmp_path):
    write_files(tmp_path, {"r.yaml": OK})
    loaded = load_recipe(tmp_path / "r.yaml", [f"description=http://u:{PW}@h"], environ={})
    clear = loaded.recipe.model_dump(mode="json")  # as a run directory written before redaction holds it
    rotated = load_recipe(tmp_path / "r.yaml", ["description=http://u:other-password@h"], environ={})
    assert recipe_hash(clear) == recipe_hash(resolved_data(loaded)) == recipe_hash(resolved_data(rotated))


def test_model_card_never_holds_credentials(tmp_path):
    from types import SimpleNamespace

    from recipeforge.tools.model_card import render_model_card

    write_files(tmp_path, {"r.yaml": OK})
    loaded = load_recipe(tmp_path / "r.yaml", [f"model.name_or_path=https://u:{PW}@hub/org/model",
                                               f"description=Mirror https://u:{PW}@hub/org/model", URI],
                         environ={})
    plan = SimpleNamespace(backend="single", device="cpu", world_size=1, micro_batch_size=1, gradient_accumulation=1,
                           global_batch_size=1, gradient_checkpointing=False)
    card = render_model_card(recipe=loaded.recipe, recipe_data=resolved_data(loaded), plan=plan, data_stats={},
                             run_dir=tmp_path, adapter=False)
    assert PW not in card
    assert "https://u:***@hub/org/model" in card and "http://user:***@mlflow.internal:5000" in card


@pytest.mark.slow
def test_trained_run_directory_holds_no_credential(tmp_path, capsys):
    from pathlib import Path

    from recipeforge.cli import main

    tiny = Path(__file__).resolve().parents[2] / "examples" / "yaml" / "tiny" / "sft-lora.yaml"
    run = tmp_path / "run"
    code = main(["train", str(tiny), f"output.dir={run}", f"data.cache_dir={tmp_path / 'c'}", "train.max_steps=2",
                 f"description=Data mirror https://reader:{PW}@data.internal/set", "logging.progress_bar=false"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert PW not in out.out + out.err
    holding = [str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and PW.encode() in p.read_bytes()]
    assert holding == []
    assert "https://reader:***@data.internal/set" in (run / "README.md").read_text()
