"""The MCP `eval` tool's command line (recipeforge/cli/mcp_server/evaluation.py), in this process: values stay
values (targets after `--`, nothing that starts with `-`), numbers are checked at their argument, and
--trust-code comes only from the server."""

from __future__ import annotations

import argparse
import sys

import pytest

from recipeforge.cli.mcp_server.evaluation import eval_argv
from recipeforge.cli.mcp_server.records import as_data
from recipeforge.errors import RecipeError


def _error(**kwargs) -> dict:
    args = {"targets": ["runs/a"], "tasks": None, "limit": None, "batch_size": None, "checkpoints": False,
            "trust_code": False, **kwargs}
    return as_data(lambda _: {"argv": eval_argv(args.pop("targets"), args.pop("tasks"), **args)},
                   argparse.Namespace())


def test_the_command_line_puts_every_target_after_the_flags():
    argv = eval_argv(["runs/a", "runs/b"], ["mc.jsonl", "arc_easy"], limit=5, batch_size=2, checkpoints=True,
                     trust_code=False)
    assert argv[:3] == [sys.executable, "-m", "recipeforge"] and "--trust-code" not in argv
    assert argv[3:] == ["eval", "--json", "--tasks", "mc.jsonl,arc_easy", "--limit", "5", "--batch-size", "2",
                        "--checkpoints", "--", "runs/a", "runs/b"]


def test_trust_code_is_the_servers_own():
    argv = eval_argv(["runs/a"], None, limit=None, batch_size=None, checkpoints=False, trust_code=True)
    assert argv[3:] == ["--trust-code", "eval", "--json", "--", "runs/a"]


@pytest.mark.parametrize("kwargs,key", [
    ({"targets": []}, "targets"),
    ({"targets": ["--trust-code"]}, "targets"),
    ({"targets": ["runs/a", " "]}, "targets"),
    ({"targets": ["runs/\0a"]}, "targets"),
    ({"tasks": ["--limit=1"]}, "tasks"),
    ({"tasks": ["mc.jsonl", 3]}, "tasks"),
    ({"limit": 0}, "limit"),
    ({"limit": True}, "limit"),
    ({"batch_size": -2}, "batch_size"),
])
def test_bad_values_are_refused_at_their_argument(kwargs, key):
    error = _error(**kwargs)["error"]
    assert error["key"] == key, error
    with pytest.raises(RecipeError):
        eval_argv(**{"targets": ["runs/a"], "tasks": None, "limit": None, "batch_size": None,
                     "checkpoints": False, "trust_code": False, **kwargs})
