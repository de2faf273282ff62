"""recipeforge/cli/mcp_server: the records the MCP tools return, in this process: errors as data (located as the
CLI locates them), override forms, schema sections, and a run's state read from its run directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from recipeforge.cli.mcp_server import records
from recipeforge.cli.mcp_server.runs import Runs, run_path, run_status

TINY = Path(__file__).resolve().parents[3] / "examples" / "yaml" / "tiny"


def test_a_broken_recipe_is_an_error_record_with_its_place(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {TINY / 'pretrain.yaml'}\ntrain:\n  max_steps: many\n")
    error = records.as_data(records.validate, records.recipe_namespace("validate", str(recipe)))["error"]
    assert error["location"].endswith("r.yaml:3:3") and error["key"] == "train.max_steps" and error["hint"]


def test_overrides_must_be_key_value_or_tilde_key():
    for bad in ("--trust-code", "nonsense", ""):
        args = records.recipe_namespace("validate", str(TINY / "pretrain.yaml"), [bad])
        assert records.as_data(records.validate, args)["error"]["key"] == "overrides"
    ok = records.recipe_namespace("validate", str(TINY / "pretrain.yaml"), ["~output.save_steps", "train.max_steps=3"])
    assert records.as_data(records.validate, ok)["stage"] == "pretrain"


def test_no_override_sets_or_deletes_allow_code(tmp_path):
    code = tmp_path / "code.yaml"
    code.write_text(f"extends: {TINY / 'pretrain.yaml'}\nmodel:\n  trust_remote_code: true\n")
    for bad in ("allow_code=true", " allow_code =true", "allow_code=yes", "~allow_code", "allow_code.x=1"):
        for make in (records.validate, records.plan, records.resolve):
            error = records.as_data(make, records.recipe_namespace("validate", str(code), [bad]))["error"]
            assert error["key"] == "allow_code" and "--trust-code" in error["hint"], (bad, error)
    assert records.override_root("data.datasets[0].path=x") == "data"
    assert records.override_root("~allow_code_note") == "allow_code_note"


def test_schema_section_carries_the_definitions_it_uses():
    import argparse

    section = records.schema(argparse.Namespace(section="data"))
    assert section["schema"]["$ref"] == "#/$defs/DataConfig" and "DatasetSpec" in section["$defs"]
    assert "oneOf" in records.schema(argparse.Namespace(section=None))


def _run_dir(root: Path, *, final: bool = False, checkpoint: bool = False, holder: int | None = None) -> Path:
    root.mkdir(parents=True)
    rows = [{"split": "train", "step": 2, "loss": 3.5}, {"split": "train", "step": 4, "loss": 2.25}]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"split": "tra')
    if final:
        (root / "final").mkdir()
    if checkpoint:
        (root / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    if holder is not None:
        import socket

        (root / ".recipeforge.lock").write_text(json.dumps({"pid": holder, "host": socket.gethostname()}))
    return root


def test_a_runs_state_comes_from_its_run_directory(tmp_path):
    running = run_status(_run_dir(tmp_path / "a", holder=os.getpid()))
    assert running["state"] == "running" and running["last_step"] == 4 and running["last_loss"] == 2.25
    assert running["metrics_partial_last_line"] is True
    assert run_status(_run_dir(tmp_path / "b", final=True))["state"] == "finished"
    assert run_status(_run_dir(tmp_path / "c", checkpoint=True), exit_code=75)["state"] == "preempted"
    assert run_status(_run_dir(tmp_path / "d", checkpoint=True))["state"] == "stopped"
    assert run_status(_run_dir(tmp_path / "e"), exit_code=1)["state"] == "failed"
    early = run_status(_run_dir(tmp_path / "f"), exit_code=-15)  # SIGTERM during start-up
    assert early["state"] == "stopped" and early["resumable"] is False
    assert run_status(_run_dir(tmp_path / "g", checkpoint=True), exit_code=1)["resumable"] is True


def test_stop_signals_only_runs_this_server_started(tmp_path):
    import argparse

    error = records.as_data(lambda a: Runs().stop(a.run_dir), argparse.Namespace(run_dir=str(tmp_path)))
    assert "started no run" in error["error"]["message"]


def test_status_refuses_a_directory_that_is_no_run(tmp_path):
    import argparse

    (tmp_path / "notes").mkdir()
    error = records.as_data(lambda a: Runs().status(a.run_dir), argparse.Namespace(run_dir=str(tmp_path / "notes")))
    assert "is not a run directory" in error["error"]["message"]
    run = _run_dir(tmp_path / "run", final=True)
    assert Runs().status(str(run))["state"] == "finished"


def test_train_refuses_a_run_directory_another_live_process_holds(tmp_path):
    run = _run_dir(tmp_path / "busy", holder=os.getpid())
    args = records.recipe_namespace("train", str(TINY / "pretrain.yaml"), [f"output.dir={run}"])
    error = records.as_data(Runs().train, args)["error"]
    assert "in use by another run" in error["message"] and error["key"] == "output.dir", error
    assert not (tmp_path / "busy.train.log").exists()  # nothing started


def test_one_run_directory_has_one_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_path("runs/x") == run_path("./runs/../runs/x") == run_path(tmp_path / "runs" / "x") == tmp_path / "runs/x"
