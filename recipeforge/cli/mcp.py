"""The command mcp: recipeforge as an MCP server over stdio, for agents (recipeforge/cli/mcp_server/). It needs
the `mcp` extra; validate and plan through it import neither torch nor transformers."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from recipeforge.cli.exit_codes import EXIT_USER_ERROR

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_mcp(sub: Subparsers) -> None:
    p = sub.add_parser("mcp", help="serve recipeforge's commands as MCP tools over stdio, for agents",
                       description="An MCP server over stdio with the tools validate, plan, resolve, diff, "
                                   "schema, report, status, train, stop and eval; each returns the record the "
                                   "command prints with --json, errors as data (message, file:line, key, hint). "
                                   "A recipe naming code trains only with its allow_code: true or "
                                   "--trust-code given to this command. Needs: pip install 'recipeforge[mcp]'.")
    p.add_argument("--no-train", action="store_true", help="leave out the train, stop and eval tools (read-only server)")
    p.set_defaults(func=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        print("error: recipeforge mcp needs the MCP SDK: pip install 'recipeforge[mcp]'", file=sys.stderr)
        return EXIT_USER_ERROR
    from recipeforge.cli.mcp_server.server import serve

    serve(trust_code=bool(args.trust_code), allow_train=not args.no_train)
    return 0
