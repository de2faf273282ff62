"""The web app of `recipeforge ui`: the page, its assets and the JSON API, on Starlette.

Reading: ``GET /api/runs``, ``/api/run``, ``/api/metrics``, ``/api/log``, ``/api/diff``, ``/api/recipes``,
``/api/recipe``. Changing something: ``POST /api/check`` (an edit validated and planned; changes nothing but
is a POST for its body), ``/api/form`` (an edit's form: fields, resolved values; a POST for its body too),
``/api/set_key`` (an edit's text with one key set; nothing is written), ``/api/save``, ``/api/command``, ``/api/launch``, ``/api/stop``. Every request
passes `Access` first (the key, the Host, the page token; see access.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Send

from recipeforge.cli.error_data import error_record
from recipeforge.cli.mcp_server.records import Record, recipe_namespace
from recipeforge.cli.mcp_server.runs import Runs
from recipeforge.cli.ui_server.access import SESSION_COOKIE, TOKEN_HEADER, Access, NotFound, Refused, confined
from recipeforge.cli.ui_server.editor import Editor, command_line
from recipeforge.cli.ui_server.runs_view import RunsView
from recipeforge.errors import RecipeError

ASSETS = Path(__file__).resolve().parent / "assets"
# The files the page loads, by URL name: nothing else under assets/ (or anywhere) is served.
ASSET_TYPES = {"app.js": "text/javascript", "style.css": "text/css", "chart.min.js": "text/javascript",
               "LICENSE.chart.js.txt": "text/plain"}
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_BODY = 4_000_000


@dataclass
class UiConfig:
    """What `recipeforge ui` was started with."""

    runs_dir: Path
    recipes_dir: Path
    key: str | None
    local_only: bool
    trust_code: bool = False


def build_app(config: UiConfig) -> Starlette:
    """The Starlette app: the page, its assets and the API over the runs and recipes folders."""
    access = Access(config.key, local_only=config.local_only)
    runs = Runs(trust_code=config.trust_code)
    view = RunsView(config.runs_dir, runs)
    editor = Editor(config.recipes_dir, trust_code=config.trust_code)

    def api(handler: Callable[[Any], Record | list[Any]], method: str = "GET") -> Route:
        """An API route: access checked, the body (POST) or query read, `handler` run off the event loop,
        its record returned as JSON; a refusal is 403, a missing run or recipe 404, another problem 400."""
        async def endpoint(request: Request) -> Response:
            if method == "POST":
                try:
                    raw = await request.body()
                    if len(raw) > MAX_BODY:
                        raise RecipeError(f"the request is larger than {MAX_BODY} bytes")
                    body = json.loads(raw or b"{}")
                    if not isinstance(body, dict):
                        raise ValueError("not an object")
                except (ValueError, RecipeError) as exc:
                    return JSONResponse({"error": {"message": f"the request body is not a JSON object ({exc})",
                                                   "location": None, "key": None, "hint": None}}, status_code=400)
                given: Any = body
            else:
                given = dict(request.query_params)
            try:
                result = await run_in_threadpool(handler, given)
            except Refused as exc:
                return JSONResponse(error_record(exc), status_code=403)
            except NotFound as exc:
                return JSONResponse(error_record(exc), status_code=404)
            except RecipeError as exc:
                return JSONResponse(error_record(exc), status_code=400)
            except Exception as exc:  # a bug or an unreadable file: one line, never a traceback
                from recipeforge.config.secrets import scrub
                from recipeforge.errors import bounded_text

                return _error(500, f"internal error: {type(exc).__name__}: {bounded_text(scrub(str(exc)))}")
            return JSONResponse(result)

        return Route(f"/api/{handler.__name__.rstrip('_')}", endpoint, methods=[method])

    def runs_(q: dict[str, Any]) -> Record:
        return {"runs": view.listing(), "runs_dir": str(config.runs_dir)}

    def run(q: dict[str, Any]) -> Record:
        return view.detail(q.get("name"))

    def metrics(q: dict[str, Any]) -> Record:
        since = q.get("since", "0")
        return view.metrics(q.get("name"), int(since) if str(since).isdigit() else 0)

    def log(q: dict[str, Any]) -> Record:
        view.find(q.get("name"))
        return view.log(q.get("name"))

    def diff(q: dict[str, Any]) -> Record:
        return view.diff(q.get("a"), q.get("b"))

    def recipes(q: dict[str, Any]) -> Record:
        return {"recipes": editor.listing(), "recipes_dir": str(config.recipes_dir)}

    def recipe(q: dict[str, Any]) -> Record:
        return editor.open(q.get("path"))

    def check(b: dict[str, Any]) -> Record:
        return editor.check(b.get("path"), b.get("text"), b.get("hardware"), b.get("overrides"))

    def form(b: dict[str, Any]) -> Record:
        return editor.form(b.get("path"), b.get("text"))

    def set_key(b: dict[str, Any]) -> Record:
        return editor.set_key(b.get("path"), b.get("text"), b.get("key"), b.get("value"))

    def save(b: dict[str, Any]) -> Record:
        return editor.save(b.get("path"), b.get("text"))

    def run_dir_of(name: object) -> Path:
        if not isinstance(name, str) or not RUN_NAME.match(name):
            raise RecipeError(f"run name {str(name)[:80]!r} is not a folder name", key="name",
                              hint="letters, digits, '.', '_' and '-', starting with a letter or digit")
        return confined(config.runs_dir, name, what="run")

    def command(b: dict[str, Any]) -> Record:
        _, argv = editor.command(b.get("path"), run_dir_of(b.get("name")), b.get("overrides"))
        return {"argv": argv, "command_line": command_line(argv)}

    def launch(b: dict[str, Any]) -> Record:
        path = editor.path_of(b.get("path"))
        run_dir = run_dir_of(b.get("name"))
        extra, argv = editor.command(b.get("path"), run_dir, b.get("overrides"))
        started = runs.train(recipe_namespace("train", editor.shown_path(path), extra))
        return {**started, "name": run_dir.name, "argv": argv, "command_line": command_line(argv)}

    def stop(b: dict[str, Any]) -> Record:
        return runs.stop(str(view.find(b.get("name"))))

    async def page(request: Request) -> Response:
        html = (ASSETS / "index.html").read_text(encoding="utf-8")
        html = html.replace("{{TOKEN}}", access.token).replace("{{TRUST}}", "true" if config.trust_code else "false")
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSET_TYPES:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response((ASSETS / name).read_bytes(), media_type=ASSET_TYPES[name])

    async def login(request: Request) -> Response:
        from urllib.parse import parse_qs

        # The form's one field, read here (Starlette's form parser needs python-multipart).
        body = (await request.body())[:10_000].decode("utf-8", errors="replace")
        given = (parse_qs(body).get("key") or [""])[0]
        if not access.login_ok(given):
            return HTMLResponse(_login_page("wrong key"), status_code=401)
        response = RedirectResponse("/", status_code=303)
        assert access.session is not None
        response.set_cookie(SESSION_COOKIE, access.session, httponly=True, samesite="strict")
        return response

    routes = [Route("/", page), Route("/assets/{name}", asset), Route("/login", login, methods=["POST"]),
              api(runs_), api(run), api(metrics), api(log), api(diff), api(recipes), api(recipe),
              api(check, "POST"), api(form, "POST"), api(set_key, "POST"), api(save, "POST"), api(command, "POST"), api(launch, "POST"), api(stop, "POST")]
    app = Starlette(routes=routes)
    app.add_middleware(_Guard, access=access)
    return app


class _Guard:
    """Checks every request before its route: the Host (bound locally), the key, and for the API the page
    token (or the key as a bearer header, for scripts), and same-origin POSTs."""

    def __init__(self, app: Callable[..., Awaitable[None]], access: Access):
        self.app = app
        self.access = access

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = request.url.path
        refusal = self._refusal(request, path)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, request: Request, path: str) -> Response | None:
        access = self.access
        if not access.host_ok(request.headers.get("host")):
            return _error(421, "this server answers requests for this machine only (Host header)")
        is_api = path.startswith("/api/")
        bearer = access.bearer_ok(request.headers.get("authorization"))
        if path != "/login" and not access.key_ok(request.headers.get("authorization"),
                                                  request.cookies.get(SESSION_COOKIE)):
            if is_api:
                return _error(401, "missing or wrong key (log in on the page, or send Authorization: Bearer KEY)")
            return HTMLResponse(_login_page(None), status_code=401)
        if is_api and not bearer and not access.token_ok(request.headers.get(TOKEN_HEADER)):
            return _error(403, f"missing or wrong page token ({TOKEN_HEADER}): load the page again")
        origin = request.headers.get("origin")
        if request.method == "POST" and origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host')}":
            return _error(403, "a request from another site's page")
        return None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "location": None, "key": None, "hint": None}},
                        status_code=status)


def _login_page(problem: str | None) -> str:
    note = f'<p class="problem">{problem}</p>' if problem else ""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>recipeforge ui: log in</title></head>"
            "<body style='font-family:sans-serif;margin:3em'><h1>recipeforge ui</h1>"
            f"<p>This server needs its key (the variable named by --key-env where it was started).</p>{note}"
            "<form method='post' action='/login'><input type='password' name='key' autofocus>"
            "<button type='submit'>Log in</button></form></body></html>")
