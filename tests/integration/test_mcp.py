"""`recipeforge mcp` driven as an agent drives it: the MCP SDK's own client starts ``python -m recipeforge mcp``
over stdio, lists the tools, validates, plans, trains a tiny recipe in the background, follows it with status,
stops a run with SIGTERM (preempted, checkpoint saved) and reads the report; hostile input is refused as data
and never run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "yaml" / "tiny"
MC = [{"prompt": "The sky is", "choices": ["blue", "green", "loud"], "answer": 0},
      {"prompt": "Two plus two is", "choices": ["five", "four"], "answer": 1}]
SHORT = ["train.max_steps=4", "train.logging_steps=2", "output.save_steps=2", "logging.progress_bar=false"]


def _params(tmp_path: Path, *flags: str) -> StdioServerParameters:
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "RECIPEFORGE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return StdioServerParameters(command=sys.executable, args=["-m", "recipeforge", "mcp", *flags], env=env,
                                 cwd=str(tmp_path))


async def _call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict), result.content
    return result.structured_content


async def _until(client: Client, run_dir: str, states: tuple[str, ...], timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = await _call(client, "status", run_dir=run_dir)
        if status["state"] in states or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.5)


def test_tools_listed_and_recipes_checked_as_data(tmp_path):
    async def scenario() -> None:
        async with Client(_params(tmp_path, "--no-train")) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"validate", "plan", "resolve", "diff", "schema", "report", "status"}
            broken = tmp_path / "broken.yaml"
            broken.write_text(f"extends: {TINY / 'pretrain.yaml'}\ntrain:\n  learning_rate: fast\n")
            error = (await _call(client, "validate", recipe=str(broken)))["error"]
            assert error["location"] == "broken.yaml:3:3", error  # file:line:col, as `recipeforge validate` says
            assert error["key"] == "train.learning_rate" and "Traceback" not in error["message"]
            ok = await _call(client, "validate", recipe=str(TINY / "pretrain.yaml"))
            assert ok == {"ok": True, "recipe": str(TINY / "pretrain.yaml"), "stage": "pretrain",
                          "model": "tiny:llama", "adapter": "none"}
            plan = await _call(client, "plan", recipe=str(TINY / "pretrain.yaml"), overrides=["train.max_steps=3"])
            assert "error" not in plan and plan["backend"], plan
            other = await _call(client, "plan", recipe=str(TINY / "pretrain.yaml"), hardware="8xH100-80GB",
                                overrides=["train.global_batch_size=64"])
            assert "error" not in other and other != plan
            resolved = await _call(client, "resolve", recipe=str(TINY / "pretrain.yaml"), overrides=["train.max_steps=3"])
            assert resolved["resolved"]["train"]["max_steps"] == 3
            diff = await _call(client, "diff", a=str(TINY / "pretrain.yaml"), b=str(TINY / "sft-full.yaml"))
            assert diff["equal"] is False and diff["recipe"]
            section = await _call(client, "schema", section="train")
            assert "TrainConfig" in section["$defs"]
            assert (await _call(client, "schema", section="trian"))["error"]["hint"] == "did you mean 'train'?"
            assert "error" in await _call(client, "report", run_dir=str(tmp_path / "nowhere"))

    asyncio.run(scenario())


@pytest.mark.slow
def test_train_status_report_and_stop(tmp_path):
    async def scenario() -> None:
        async with Client(_params(tmp_path)) as client:
            run_dir = str(tmp_path / "runs" / "short")
            started = await _call(client, "train", recipe=str(TINY / "pretrain.yaml"),
                                  overrides=[*SHORT, f"output.dir={run_dir}"])
            assert started["run_dir"] == run_dir and started["pid"] > 0, started
            assert "--trust-code" not in started["command"]  # never added by the tool on its own
            status = await _until(client, run_dir, ("finished", "failed", "preempted", "stopped"))
            assert status["state"] == "finished", status
            assert status["last_step"] == 4 and isinstance(status["last_loss"], float) and status["exit_code"] == 0
            report = await _call(client, "report", run_dir=run_dir)
            assert report["status"] == "finished" and report["steps"] == 4 and report["stage"] == "pretrain"

            # eval: lm-eval on a local task, the record of `recipeforge eval --json`, scores kept in the run
            (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC))
            scored = await _call(client, "eval", targets=[run_dir], tasks=[str(tmp_path / "mc.jsonl")])
            [run] = scored["runs"]
            mc = run["subjects"]["final"]["mc"]
            assert run["run_dir"] == run_dir and mc["samples"] == len(MC), scored
            assert mc["scores"] == json.loads(Path(mc["file"]).read_text())["scores"]
            assert Path(mc["file"]).parent == Path(run_dir) / "eval"
            missing = (await _call(client, "eval", targets=[run_dir], tasks=["hellaswagg"]))["error"]
            assert "unknown lm-eval task 'hellaswagg'" in missing["message"] and missing["hint"], missing

            # A long run stopped with SIGTERM: a checkpoint is saved and the run reads as preempted.
            long_dir = str(tmp_path / "runs" / "long")
            await _call(client, "train", recipe=str(TINY / "pretrain.yaml"),
                        overrides=["train.max_steps=2000", "train.logging_steps=1", "output.save_steps=1000",
                                   "logging.progress_bar=false", f"output.dir={long_dir}"])
            deadline = time.monotonic() + 300
            while (await _call(client, "status", run_dir=long_dir))["last_step"] is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.5)
            stopped = await _call(client, "stop", run_dir=long_dir)
            assert stopped["stopped"] is True and stopped["signal"] == "SIGTERM"
            status = await _until(client, long_dir, ("finished", "failed", "preempted", "stopped"))
            assert status["state"] == "preempted" and status["exit_code"] == 75, status
            assert status["checkpoints"] and status["resumable"]
            # Stopped during its start-up, before it could save anything: stopped, not failed.
            early_dir = str(tmp_path / "runs" / "early")
            await _call(client, "train", recipe=str(TINY / "pretrain.yaml"), overrides=[*SHORT, f"output.dir={early_dir}"])
            assert (await _call(client, "stop", run_dir=early_dir))["stopped"] is True
            status = await _until(client, early_dir, ("finished", "failed", "preempted", "stopped"))
            assert status["state"] in ("stopped", "preempted") and status["exit_code"] in (-15, 75), status
            # Only runs this server started are signalled.
            assert "error" in await _call(client, "stop", run_dir=str(tmp_path / "runs" / "elsewhere"))

    asyncio.run(scenario())


def test_hostile_input_refused_and_never_run(tmp_path):
    code = tmp_path / "code.yaml"
    code.write_text(f"extends: {TINY / 'pretrain.yaml'}\nmodel:\n  trust_remote_code: true\n"
                    f"output:\n  dir: {tmp_path / 'runs' / 'code'}\n")
    marker = tmp_path / "pwned"

    async def scenario() -> None:
        async with Client(_params(tmp_path)) as client:
            error = (await _call(client, "train", recipe=str(code)))["error"]
            assert "allow_code" in error["message"] + (error["hint"] or "") and ":3" in (error["location"] or ""), error
            # The opt-in is the recipe's own: an override cannot give it.
            error = (await _call(client, "train", recipe=str(code), overrides=["allow_code=true"]))["error"]
            assert error["key"] == "allow_code" and "--trust-code" in error["hint"], error
            shell = f"train.max_steps=2; touch {marker}"
            error = (await _call(client, "train", recipe=str(TINY / "pretrain.yaml"), overrides=[shell]))["error"]
            assert error["key"] == "train.max_steps", error
            error = (await _call(client, "train", recipe=str(TINY / "pretrain.yaml"),
                                 overrides=["--trust-code"]))["error"]
            assert error["key"] == "overrides"
            # eval's values never become flags, and a task config (code to lm-eval) needs the opt-in
            for targets, tasks, key in ((["--trust-code"], None, "targets"), ([str(tmp_path)], ["--limit=1"], "tasks")):
                error = (await _call(client, "eval", targets=targets, tasks=tasks))["error"]
                assert error["key"] == key, error
            error = (await _call(client, "eval", targets=[str(tmp_path)], limit=0))["error"]
            assert error["key"] == "limit", error
            finished = tmp_path / "finished"  # what a finished run leaves, as far as eval reads it first
            (finished / "final").mkdir(parents=True)
            (finished / "final" / "config.json").write_text("{}")
            (finished / "resolved_recipe.yaml").write_text("stage: sft\n")
            task = tmp_path / "my_task.yaml"
            task.write_text(f"task: my_task\ndoc_to_text: !function {marker.name}.run\n")
            error = (await _call(client, "eval", targets=[str(finished)], tasks=[str(task)]))["error"]
            assert "opt-in" in error["message"] and error["key"] == "--tasks", error
            assert "eval" in {t.name for t in (await client.list_tools()).tools}

    async def opted_in() -> None:
        own = tmp_path / "own.yaml"  # the recipe's own opt-in
        own.write_text(code.read_text() + "allow_code: true\n")
        async with Client(_params(tmp_path)) as client:
            assert (await _call(client, "validate", recipe=str(own)))["ok"] is True
        async with Client(_params(tmp_path, "--trust-code")) as client:  # the server's opt-in
            assert (await _call(client, "validate", recipe=str(code)))["ok"] is True

    asyncio.run(scenario())
    asyncio.run(opted_in())
    assert not marker.exists() and not (tmp_path / "runs").exists()


def test_validate_and_plan_import_no_torch_and_the_extra_is_named(tmp_path):
    script = f"""
import asyncio, sys
from mcp import Client
from recipeforge.cli.mcp_server.server import build_server
async def main():
    async with Client(build_server()) as client:
        for tool in ("validate", "plan"):
            result = await client.call_tool(tool, {{"recipe": {str(TINY / 'sft-lora.yaml')!r}}})
            assert "error" not in result.structured_content, result.structured_content
asyncio.run(main())
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "HEAVY=\n" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    # Without the SDK: exit 2 and the extra to install.
    blocked = "import sys; sys.modules['mcp'] = None; from recipeforge.cli.entry import main; sys.exit(main(['mcp']))"
    proc = subprocess.run([sys.executable, "-c", blocked], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "pip install 'recipeforge[mcp]'" in proc.stderr, proc.stderr
