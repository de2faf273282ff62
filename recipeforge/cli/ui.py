"""The command ui: a local web page over a folder of runs and the recipes beside them
(recipeforge/cli/ui_server/). It needs the `ui` extra (Starlette, uvicorn); --help imports neither."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from recipeforge.cli.exit_codes import EXIT_USER_ERROR
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.types import ASGIApp

    from recipeforge.cli.common import Subparsers

KEY_ENV = "RECIPEFORGE_UI_KEY"


def add_ui(sub: Subparsers) -> None:
    p = sub.add_parser("ui", help="a local web page: runs with live charts, a recipe editor that validates and "
                                  "plans as you type, launch and stop",
                       description="Serve a web page over RUNS_DIR (every run: status, live loss / learning rate "
                                   "/ reward charts, plan, resolved recipe, eval scores, the diff of two runs) "
                                   "and the recipe files under --recipes (edit one: errors at their line and the "
                                   "plan as you type; launch `recipeforge train` and stop it with SIGTERM, which "
                                   "saves a checkpoint). Binds to 127.0.0.1 unless --host says otherwise; "
                                   "elsewhere only with a key. Needs: pip install 'recipeforge[ui]'.")
    p.add_argument("runs_dir", nargs="?", default="runs", metavar="RUNS_DIR",
                   help="the folder of run directories (default: runs); launched runs go there too")
    p.add_argument("--recipes", default=".", metavar="DIR",
                   help="the folder whose recipe files the page may open and edit (default: the current one)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 takes any free port)")
    p.add_argument("--key-env", default=KEY_ENV, metavar="VAR",
                   help=f"the environment variable holding the key every request must carry (default {KEY_ENV}); "
                        "required to bind anywhere but this machine")
    p.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("error: recipeforge ui needs Starlette and uvicorn: pip install 'recipeforge[ui]'", file=sys.stderr)
        return EXIT_USER_ERROR
    from recipeforge.registry import code_trust

    runs_dir, recipes_dir = Path(args.runs_dir), Path(args.recipes)
    key = ui_key(args.key_env, os.environ)
    local = check_bind(args.host, args.port, key, args.key_env)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise RecipeError(f"{runs_dir} is not a folder", hint="give the folder that holds your run directories")
    if not recipes_dir.is_dir():
        raise RecipeError(f"--recipes {recipes_dir}: no such folder", hint="give the folder of your recipe files")
    runs_dir.mkdir(parents=True, exist_ok=True)
    sock = bind(args.host, args.port)
    from recipeforge.cli.ui_server.app import UiConfig, build_app

    app = build_app(UiConfig(runs_dir=runs_dir, recipes_dir=recipes_dir, key=key, local_only=local,
                             trust_code=code_trust()[0]))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"recipeforge ui: http://{shown}:{port}/ (runs: {runs_dir}, recipes: {recipes_dir}"
          f"{', key required' if key else ''}); Ctrl-C stops it", flush=True)
    serve(app, sock)
    return 0


def ui_key(var: str, environ: Mapping[str, str]) -> str | None:
    """The key from the environment variable `var` (None when unset); an empty one, or one a header cannot
    carry, is refused rather than turned into a server without a key."""
    key = environ.get(var)
    if key is None:
        return None
    if not key.strip():
        raise RecipeError(f"the environment variable {var} is set but empty",
                          hint=f"give the key the page must be opened with, or unset {var} (on 127.0.0.1 only)")
    if any(not ch.isprintable() or ch.isspace() for ch in key):
        raise RecipeError(f"the environment variable {var} holds whitespace or control characters",
                          hint="use a key of printable characters without spaces")
    return str(key)


def check_bind(host: str, port: int, key: str | None, var: str) -> bool:
    """Refuse an address beyond this machine without a key; returns whether the address is this machine's."""
    from recipeforge.tools.serve_engines import is_loopback

    if not 0 <= port <= 65535:
        raise RecipeError(f"--port {port} is not a port", hint="give 1-65535, or 0 for any free port")
    local = is_loopback(host)
    if not local and key is None:
        where = "every interface" if host.strip() in ("", "0.0.0.0", "::") else host
        raise RecipeError(f"--host {host or '(all)'} serves the UI on {where} without a key: anyone who reaches "
                          "this machine could read your runs and start training", key="--host",
                          hint=f"export {var}=<a long random key> (the page asks for it), or keep the default "
                               "--host 127.0.0.1")
    return local


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (bound before anything else starts, so a taken port is said at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RecipeError(f"cannot listen on {host}:{port}: {exc.strerror}",
                          hint="choose another --port (0 takes any free one)") from None
    sock.listen(64)
    return sock


def serve(app: ASGIApp, sock: socket.socket) -> None:
    """Serve `app` on `sock` until Ctrl-C or SIGTERM (uvicorn; runs this server started keep training)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
