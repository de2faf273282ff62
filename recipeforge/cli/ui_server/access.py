"""Who may use the UI, and which files it may read.

Requests: with a key, every request carries it (``Authorization: Bearer KEY``, or the session cookie the
login form sets, derived from the key, never the key itself), compared in constant time. Every ``/api/``
request also carries the page's token (``X-RecipeForge-Token``, handed out inside the page only), so a
page of another site cannot call the API from the user's browser: it cannot read the token, and a custom
header would need a CORS answer this server never gives. Bound to this machine only, the ``Host`` header
must name it too (a DNS-rebinding page names its own host).

Files: a path the page sends is relative to a root (the runs folder, the recipes folder). An absolute
path, ``~``, ``..``, a backslash or a NUL are refused, and so is a path whose real location (symbolic
links followed) is outside the root.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path, PurePosixPath

from recipeforge.errors import RecipeError

TOKEN_HEADER = "x-recipeforge-token"
SESSION_COOKIE = "recipeforge_ui_session"
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


class Refused(RecipeError):
    """A request for something outside what the UI may read or do (HTTP 403)."""


class NotFound(RecipeError):
    """A run or recipe that is not there (HTTP 404)."""


class Access:
    """The server's key (None: no key, this machine only), the page token and the session cookie's value."""

    def __init__(self, key: str | None, *, local_only: bool):
        self.key = key
        self.local_only = local_only
        self.token = secrets.token_urlsafe(32)  # per server start: a page from an earlier start is refused
        # The cookie holds a value derived from the key (and this start's token), so the key itself is never
        # stored in the browser and a cookie from an earlier start stops working.
        self.session = (hmac.new(key.encode("utf-8", "surrogateescape"), self.token.encode(), hashlib.sha256)
                        .hexdigest() if key is not None else None)

    def key_ok(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether the request carries the key (a bearer header or the login's cookie); True without a key."""
        if self.key is None:
            return True
        bearer = self.bearer_ok(authorization)
        assert self.session is not None
        by_cookie = cookie is not None and hmac.compare_digest(cookie.encode("utf-8", "surrogateescape"),
                                                               self.session.encode())
        return bearer or by_cookie

    def bearer_ok(self, authorization: str | None) -> bool:
        """Whether ``Authorization: Bearer KEY`` names the key (constant time; False without a key)."""
        if self.key is None or authorization is None:
            return False
        return hmac.compare_digest(authorization.encode("utf-8", "surrogateescape"),
                                   f"Bearer {self.key}".encode("utf-8", "surrogateescape"))

    def login_ok(self, given: str) -> bool:
        """Whether the key typed into the login form is the key."""
        return self.key is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                            self.key.encode("utf-8", "surrogateescape"))

    def token_ok(self, given: str | None) -> bool:
        """Whether an API request carries this start's page token."""
        return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token.encode())

    def host_ok(self, host_header: str | None) -> bool:
        """Bound to this machine only: the Host header must name it (a DNS-rebinding page names another)."""
        if not self.local_only:
            return True
        if not host_header:
            return False
        name = host_header.strip().lower()
        if name.startswith("["):  # [::1]:8080
            name = name[1:].split("]", 1)[0]
        elif name.count(":") == 1:
            name = name.rsplit(":", 1)[0]
        return name in LOCAL_NAMES or name.startswith("127.")


def confined(root: Path, rel: object, *, what: str) -> Path:
    """`rel` (a path the page sent) under `root`, with symbolic links followed; `Refused` when it is not a
    plain relative path or its real location is outside `root`."""
    if not isinstance(rel, str) or not rel.strip():
        raise Refused(f"no {what} given", hint=f"give the {what} relative to {root}")
    if "\x00" in rel or "\\" in rel or rel.startswith("~") or len(rel) > 1000:
        raise Refused(f"{what} {rel[:80]!r} is not a plain relative path", hint=f"give it relative to {root}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise Refused(f"{what} {rel[:80]!r} leaves its folder", key=what,
                      hint=f"only paths inside {root} can be opened here (no absolute paths, no '..')")
    real_root = root.resolve()
    target = (real_root / pure).resolve()
    if not target.is_relative_to(real_root):
        raise Refused(f"{what} {rel[:80]!r} is a link out of {root}", key=what,
                      hint=f"only files whose real location is inside {root} can be opened here")
    return target


def inside(root: Path, path: Path) -> bool:
    """Whether the real location of `path` (links followed) is inside `root`."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a loop of links
        return False
