"""The network services a recipe names, checked before a run starts.

A tracker server, the Hub a run pushes to, a generation server: when one is unreachable, refuses the
credentials or does not answer, the run is refused up front (exit 2) with the service named, the key
that names it and its URL with any credentials hidden, instead of an internal error after minutes of
retries once the run directory exists. Each check is one short HTTP request (standard library only, no
tracker package imported); a generation server that may still be starting is waited for as long as
its engine's own timeout says.

What cannot be checked up front (a service that fails mid-run) is handled where it is used: trackers
stop logging with a warning (`outputs.trackers`), a failed push leaves the finished run on disk
(`tools.hub`).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from recipeforge.credentials import redact_credentials
from recipeforge.errors import Problem, RecipeError, sort_problems
from recipeforge.stage_specs import rl_section

TIMEOUT_ENV = "RECIPEFORGE_SERVICE_TIMEOUT"  # seconds per request (default 10)
DEFAULT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Service:
    """One endpoint to check: what it is, the recipe key that names it, and how to ask it."""

    name: str                          # "MLflow tracking server"
    key: tuple                         # recipe key path, for the location of the error
    url: str                           # the request's URL (credentials stripped off, see `headers`)
    shown: str                         # the URL as the message shows it (credentials hidden)
    headers: dict = field(default_factory=dict, compare=False, repr=False)
    body: bytes | None = field(default=None, compare=False, repr=False)
    ok: Callable[[int, bytes], str | None] | None = field(default=None, compare=False, repr=False)
    wait_s: float = 0.0                # keep asking this long while nothing listens (a server starting)
    hint: str = ""
    method: str | None = None          # default: POST with a body, else GET
    refusal: str | None = None         # what HTTP 401/403 means here (default: the credentials were refused)


class ServiceUnavailable(RecipeError):
    """A service the recipe names cannot be used; the message names it and why."""


def check_services(recipe, locate: Callable[[tuple], Any] | None = None, *, environ=None,
                   downloads_only: bool = False) -> None:
    """Refuse the run (`ServiceUnavailable`, all problems together) when a service the recipe names
    cannot be reached or refuses the credentials. `downloads_only`: just where the model comes from
    (`recipeforge preprocess`, which trains nothing and logs nowhere)."""
    timeout = _timeout(environ)
    environ = os.environ if environ is None else environ
    problems: list[Problem] = []
    found = _hub_downloads(recipe, environ) + ([] if downloads_only else _services(recipe, environ))
    for service, early in found:
        reason = early or probe(service, timeout=timeout)
        if reason:
            problems.append(Problem(f"{service.name} at {service.shown} {reason}",
                                    locate(service.key) if locate else None, ".".join(map(str, service.key)),
                                    service.hint))
    if problems:
        raise ServiceUnavailable(sort_problems(problems))


def probe(service: Service, *, timeout: float) -> str | None:
    """Ask `service` once (or until its `wait_s` is over while nothing listens); None when it answered
    as expected, else why not (one clause: "is unreachable: connection refused")."""
    deadline = time.monotonic() + service.wait_s
    while True:
        reason, retry = _ask(service, timeout)
        if not retry or time.monotonic() >= deadline:
            return reason
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def _ask(service: Service, timeout: float) -> tuple[str | None, bool]:
    request = urllib.request.Request(service.url, data=service.body, headers=service.headers,
                                     method=service.method or ("POST" if service.body is not None else "GET"))
    try:
        with _opener().open(request, timeout=timeout) as response:
            status, payload = response.status, response.read(65536)
    except urllib.error.HTTPError as exc:
        status, payload = exc.code, exc.read(65536) if exc.fp is not None else b""
    except (socket.timeout, TimeoutError):
        return f"did not answer within {timeout:g} s", True
    except urllib.error.URLError as exc:
        why = exc.reason
        if isinstance(why, (socket.timeout, TimeoutError)):
            return f"did not answer within {timeout:g} s", True
        return f"is unreachable: {_reason_text(why)}", True
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"is unreachable: {_reason_text(exc)}", True
    if status in (401, 403):
        return service.refusal or f"refused the credentials (HTTP {status})", False
    if service.ok is not None:
        return service.ok(status, payload), False
    return (None if status < 500 else f"answered HTTP {status}"), False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer (the Hub sends file requests on to its CDN); it is not followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _opener():
    # Proxies from the environment apply as they do for the libraries.
    return urllib.request.build_opener(_NoRedirect)


def _reason_text(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "unknown host"
    text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    return redact_credentials(" ".join(str(text).split()))[:200]


def _timeout(environ) -> float:
    """Seconds per request: this process's settings, or those of an environment given for a check."""
    from recipeforge.settings import Settings, current

    return (current() if environ is None else Settings.from_environment(environ)).service_timeout


def split_credentials(url: str) -> tuple[str, dict]:
    """`url` without its userinfo, and the Basic authorization header the userinfo stood for."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


# ----------------------------------------------------------------------------- the services

def _services(recipe, environ) -> list[tuple[Service, str | None]]:
    """(service, reason known without asking) for every service the recipe uses."""
    found: list[tuple[Service, str | None]] = []
    lg = recipe.logging
    if lg.mlflow is not None:
        found.extend(_mlflow(lg.mlflow, environ))
    if lg.wandb is not None and lg.wandb.mode == "online":
        found.extend(_wandb(environ))
    hub = recipe.output.push_to_hub
    if hub is not None:
        found.extend(_hub(environ))
    rl = rl_section(recipe)
    if rl is not None and rl[1].rollout.mode == "server":
        found.extend(_rollout_server(rl[1].rollout, rl[0]))
    return found


def _mlflow(cfg, environ) -> list[tuple[Service, str | None]]:
    uri = cfg.tracking_uri or environ.get("MLFLOW_TRACKING_URI") or ""
    key = ("logging", "mlflow", "tracking_uri") if cfg.tracking_uri else ("logging", "mlflow")
    if not uri.lower().startswith(("http://", "https://")):
        return []  # a file or database store on this machine, or a managed platform's scheme
    base, headers = split_credentials(uri.rstrip("/"))
    if not headers and environ.get("MLFLOW_TRACKING_USERNAME"):
        pair = f"{environ['MLFLOW_TRACKING_USERNAME']}:{environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
        headers = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    elif not headers and environ.get("MLFLOW_TRACKING_TOKEN"):
        headers = {"Authorization": f"Bearer {environ['MLFLOW_TRACKING_TOKEN']}"}
    query = urllib.parse.urlencode({"experiment_name": cfg.experiment})

    def ok(status: int, payload: bytes) -> str | None:
        # 404 RESOURCE_DOES_NOT_EXIST: the experiment is created when the run starts.
        if status == 200 or (status == 404 and b"RESOURCE_DOES_NOT_EXIST" in payload):
            return None
        return f"answered HTTP {status} (is it an MLflow tracking server?)"

    service = Service("MLflow tracking server", key, f"{base}/api/2.0/mlflow/experiments/get-by-name?{query}",
                      redact_credentials(uri), headers=headers, ok=ok,
                      hint="start the server or fix logging.mlflow.tracking_uri (and MLFLOW_TRACKING_USERNAME/"
                           "PASSWORD or MLFLOW_TRACKING_TOKEN); without a URI, runs go to RUN/mlruns")
    return [(service, None)]


def _wandb(environ) -> list[tuple[Service, str | None]]:
    base = (environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").rstrip("/")
    key = ("logging", "wandb", "mode")
    api_key = environ.get("WANDB_API_KEY") or _netrc_password(base)
    hint = ("set WANDB_API_KEY or run `wandb login` (WANDB_BASE_URL for a W&B server of your own), or "
            "logging.wandb.mode: offline (`wandb sync RUN/wandb` uploads it later)")
    url = f"{base}/graphql"
    if not api_key and not environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return [(Service("W&B", key, url, redact_credentials(base), hint=hint), "needs an API key, and none is set")]
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Basic " + base64.b64encode(f"api:{api_key}".encode()).decode()

    def ok(status: int, payload: bytes) -> str | None:
        if status >= 500:
            return f"answered HTTP {status}"
        if api_key and status == 200:
            try:
                viewer = (json.loads(payload or b"{}").get("data") or {}).get("viewer")
            except (ValueError, AttributeError):
                viewer = {}
            if viewer is None:
                return "refused the API key (it names no user)"
        return None

    body = json.dumps({"query": "query Viewer { viewer { id } }"}).encode()
    return [(Service("W&B", key, url, redact_credentials(base), headers=headers, body=body, ok=ok, hint=hint), None)]


def _netrc_password(base_url: str) -> str | None:
    import netrc

    host = urllib.parse.urlsplit(base_url).hostname or ""
    try:
        auth = netrc.netrc(os.environ.get("NETRC")).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return auth[2] if auth else None


def _hub(environ) -> list[tuple[Service, str | None]]:
    endpoint = (environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    key = ("output", "push_to_hub")
    url = f"{endpoint}/api/whoami-v2"
    shown = redact_credentials(endpoint)
    retry = "remove output.push_to_hub and push the finished run later with `recipeforge push RUN_DIR`"
    offline = environ.get("HF_HUB_OFFLINE", "").upper()
    if offline in ("1", "ON", "YES", "TRUE"):
        return [(Service("the Hugging Face Hub", key, url, shown, hint=f"unset HF_HUB_OFFLINE, or {retry}"),
                 f"cannot be used: offline mode is on (HF_HUB_OFFLINE={environ['HF_HUB_OFFLINE']})")]
    token = _hub_token(environ)
    if not token:
        return [(Service("the Hugging Face Hub", key, url, shown,
                         hint=f"run `hf auth login` or set HF_TOKEN, or {retry}"), "needs a token, and none is set")]

    def ok(status: int, payload: bytes) -> str | None:
        if status != 200:
            return f"answered HTTP {status}"
        try:
            role = ((json.loads(payload).get("auth") or {}).get("accessToken") or {}).get("role")
        except (ValueError, AttributeError):
            role = None
        return "accepts the token for reading only; a push needs a write token" if role == "read" else None

    return [(Service("the Hugging Face Hub", key, url, shown, headers={"Authorization": f"Bearer {token}"}, ok=ok,
                     hint=f"check HF_ENDPOINT and the token (`hf auth whoami`), or {retry}"), None)]


def _hub_downloads(recipe, environ) -> list[tuple[Service, str | None]]:
    """The model (and a tokenizer named apart) when they come from the Hub and are not in its cache
    here: the Hub must answer for them (a gated or private model, with a token that has access)."""
    model = recipe.model
    wanted = [(("model", "name_or_path"), model.name_or_path, "config.json")]
    if model.tokenizer and model.tokenizer != model.name_or_path:
        wanted.append((("model", "tokenizer"), model.tokenizer, "tokenizer_config.json"))
    endpoint = (environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    offline = environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    token = _hub_token(environ)
    out: list[tuple[Service, str | None]] = []
    for key, repo, probe_file in wanted:
        if not _is_hub_id(repo) or _in_hub_cache(repo, environ):
            continue
        revision = urllib.parse.quote(model.revision or "main", safe="")
        url = f"{endpoint}/{repo}/resolve/{revision}/{probe_file}"
        name = f"the Hugging Face Hub (model {repo})"
        hint = (f"download it ahead (`hf download {repo}`) or use a local directory; a gated or private model "
                f"needs a token with access (`hf auth login` or HF_TOKEN)")
        if offline:
            out.append((Service(name, key, url, redact_credentials(endpoint), hint=hint),
                        "cannot be used: the model is not in the cache here and offline mode is on "
                        f"(HF_HUB_OFFLINE={environ['HF_HUB_OFFLINE']})"))
            continue

        def ok(status: int, payload: bytes, repo=repo) -> str | None:
            if status < 400:
                return None
            if status == 404:
                return f"has no {probe_file} for {repo} at revision {model.revision or 'main'}"
            return f"answered HTTP {status}"

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        out.append((Service(name, key, url, redact_credentials(endpoint), headers=headers, ok=ok, hint=hint,
                            method="HEAD", refusal=("refused access: the repository is gated, private or does not "
                                                    "exist, and " + ("the token has no access" if token else
                                                                     "no token is set"))), None))
    return out


def _is_hub_id(name: str) -> bool:
    """``org/name`` or ``name``: not a path on this machine, a tiny or plugin model, or a URL."""
    import re

    from recipeforge.components.tiny_spec import tiny_arch

    if tiny_arch(name) is not None or os.path.exists(os.path.expanduser(name)):
        return False
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?", name):
        return False
    from recipeforge.components.models import plugin_loader

    return plugin_loader(name) is None


def _in_hub_cache(repo: str, environ) -> bool:
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
    cache = environ.get("HF_HUB_CACHE") or environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    snapshots = os.path.join(cache, "models--" + repo.replace("/", "--"), "snapshots")
    try:
        return any(os.scandir(snapshots))
    except OSError:
        return False


def _hub_token(environ) -> str | None:
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if environ.get(name):
            return environ[name]
    home = environ.get("HF_HOME") or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  "huggingface")
    path = environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _rollout_server(rollout, section: str) -> list[tuple[Service, str | None]]:
    """Server-mode generation: the engine says where its server answers (`RolloutEngineSpec.health_path`)
    and how long a starting server is waited for (its `server_timeout` option)."""
    from recipeforge.components.rollout import rollout_engines, starts_server

    if not rollout_engines.has(rollout.engine) or starts_server(rollout):  # the run starts it itself
        return []
    spec = rollout_engines.get(rollout.engine)
    health = getattr(spec, "health_path", None)
    if health is None:
        return []
    key = (section, "rollout", "server_url") if rollout.server_url else (section, "rollout", "mode")
    url = rollout.server_url or spec.default_server_url or ""
    base, headers = split_credentials(url.rstrip("/"))
    options = dict(rollout.options or {})
    if spec.options is not None:  # the engine's defaults too (checked when the recipe loaded)
        options = spec.options.model_validate(options).model_dump()
    wait = float(options.get("server_timeout") or 0)

    def ok(status: int, payload: bytes) -> str | None:
        return None if status == 200 else f"answered HTTP {status} at {health} (is it a {spec.name} server?)"

    return [(Service(f"the {spec.name} generation server", key, base + health, redact_credentials(url),
                     headers=headers, ok=ok, wait_s=wait,
                     hint=f"start it first (e.g. `trl vllm-serve --model MODEL`) or set {section}.rollout.server_url"
                          f"{f'; waited {wait:g} s ({section}.rollout.options.server_timeout)' if wait else ''}"), None)]
