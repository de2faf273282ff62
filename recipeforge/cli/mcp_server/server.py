"""The MCP server: recipeforge's commands as tools, each returning the record its ``--json`` prints or
``{"error": {...}}``.

validate, plan, resolve, diff, schema and report run in this process and import neither torch nor
transformers; train starts ``recipeforge train`` as a process of its own and status/stop follow it; eval
runs ``recipeforge eval --json`` as a process of its own and returns its record. ``--no-train`` leaves out
the tools that start work or write into runs (train, stop, eval).
"""

from __future__ import annotations

import argparse
from typing import Any

from recipeforge import __version__
from recipeforge.cli.mcp_server import records
from recipeforge.cli.mcp_server.evaluation import DEFAULT_TIMEOUT_S, eval_argv, run_eval
from recipeforge.cli.mcp_server.records import Record, as_data, recipe_namespace
from recipeforge.cli.mcp_server.runs import Runs

INSTRUCTIONS = (
    "recipeforge trains LLMs from one YAML recipe. validate a recipe, plan it (backend and per-GPU memory), "
    "then train it; poll status with the run_dir train returns, read report when it has finished. Overrides "
    "are 'key=value' or '~key' strings (e.g. train.max_steps=10). Every tool returns a JSON record, or "
    "{\"error\": {message, location (file:line), key, hint}}. A recipe that names Python code trains only "
    "with allow_code: true in it, or a server started with --trust-code.")


def build_server(*, trust_code: bool = False, allow_train: bool = True) -> Any:
    """The server and its tools (`train`, `stop` and `eval` only with `allow_train`). `trust_code`: the server was
    started with --trust-code (the caller sets the environment the recipe loader reads)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("recipeforge", version=__version__, instructions=INSTRUCTIONS)
    runs = Runs(trust_code=trust_code)

    def validate(recipe: str, overrides: list[str] | None = None) -> Record:
        """Check a recipe file (with key=value / ~key overrides) and report every problem with its file:line;
        the record of `recipeforge validate --json`."""
        return as_data(records.validate, recipe_namespace("validate", recipe, overrides))

    def plan(recipe: str, overrides: list[str] | None = None, hardware: str | None = None) -> Record:
        """The backend, batch sizes and per-GPU memory `train` would choose, with reasons (`plan --json`);
        hardware plans for other hardware than this machine, e.g. 8xH100-80GB, 2x8xA100-80GB or cpu."""
        return as_data(records.plan, recipe_namespace("plan", recipe, overrides, hardware))

    def resolve(recipe: str, overrides: list[str] | None = None) -> Record:
        """The fully resolved recipe (extends, overrides, ${...} and defaults applied), as data."""
        return as_data(records.resolve, recipe_namespace("resolve", recipe, overrides))

    def diff(a: str, b: str) -> Record:
        """The differences of two resolved recipes, each a recipe file, lock file or run directory
        (`diff --json`): equal, and the recipe and lock lines that differ."""
        return as_data(records.diff, argparse.Namespace(a=a, b=b))

    def schema(section: str | None = None) -> Record:
        """The recipe's JSON Schema (`schema`), or only one top-level section (train, data, model, ...)
        with the definitions it uses."""
        return as_data(records.schema, argparse.Namespace(section=section))

    def report(run_dir: str) -> Record:
        """A run's summary (`report --json`): status, steps, last loss, eval loss, tokens, wall time and the
        scores of `recipeforge eval`."""
        return as_data(records.report, argparse.Namespace(run_dir=run_dir))

    def status(run_dir: str) -> Record:
        """Where a run stands: running, finished, preempted, failed or stopped, from its run
        directory; the last step and train loss, its checkpoints and whether it can resume from one."""
        return as_data(lambda a: runs.status(a.run_dir), argparse.Namespace(run_dir=run_dir))

    for tool in (validate, plan, resolve, diff, schema, report, status):
        server.add_tool(tool)
    if allow_train:
        def train(recipe: str, overrides: list[str] | None = None) -> Record:
            """Start `recipeforge train RECIPE [overrides]` in the background after validating it; returns
            run_dir, pid and log. A run that exists already resumes from its newest checkpoint. A recipe
            naming code needs its own allow_code: true (or a server started with --trust-code)."""
            return as_data(runs.train, recipe_namespace("train", recipe, overrides))

        def stop(run_dir: str) -> Record:
            """Stop a run this server started with SIGTERM, the preemption signal: it saves a checkpoint
            and exits (status preempted); train the same recipe again to resume."""
            return as_data(lambda a: runs.stop(a.run_dir), argparse.Namespace(run_dir=run_dir))

        def evaluate(targets: list[str], tasks: list[str] | None = None, limit: int | None = None,
                     batch_size: int | None = None, checkpoints: bool = False,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> Record:
            """Benchmark finished runs with lm-evaluation-harness (`recipeforge eval --json`): targets are run
            directories or the recipes that trained them, tasks lm-eval task names or local task files
            (default: the recipe's eval.tasks); returns each run's scores by subject (final, checkpoint-N)
            and task. Two or more runs are evaluated on the same tasks. Waits until it is done."""
            return as_data(lambda a: run_eval(eval_argv(targets, tasks, limit=limit, batch_size=batch_size,
                                                        checkpoints=checkpoints, trust_code=runs.trust_code),
                                              timeout_s=timeout_s),
                           argparse.Namespace())

        server.add_tool(train)
        server.add_tool(stop)
        server.add_tool(evaluate, name="eval")
    return server


def serve(*, trust_code: bool = False, allow_train: bool = True) -> None:
    """Serve the tools over stdio until the client closes the connection."""
    build_server(trust_code=trust_code, allow_train=allow_train).run("stdio")
