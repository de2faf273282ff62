"""The process-wide settings that are not part of a recipe: one typed record, read from the environment
in one place.

A command a user types reads them from its environment (`Settings.from_environment`: the global flags
the CLI turned into ``RECIPEFORGE_*`` variables, the cache folder, the test faults). A launched worker
never does: the launching command writes them into the worker spec (`backends.worker_spec`), and the
worker entry (`run.worker`) installs the spec's record before anything asks (`installed`). Every
reader asks `current()`, so the two cannot disagree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEBUG_ENV = "RECIPEFORGE_DEBUG"
VERBOSE_ENV = "RECIPEFORGE_VERBOSE"
TRUST_ENV = "RECIPEFORGE_TRUST_CODE"
CACHE_ENV = "RECIPEFORGE_CACHE"
PROGRESS_INTERVAL_ENV = "RECIPEFORGE_PROGRESS_INTERVAL"
FAULT_ENV = "RECIPEFORGE_FAULT"   # crash-safety tests: kill or fail a process at a named point
SERVICE_TIMEOUT_ENV = "RECIPEFORGE_SERVICE_TIMEOUT"
PROGRESS_INTERVAL = 30.0          # seconds between plain progress lines
SERVICE_TIMEOUT = 10.0            # seconds per request when a service is checked before a run
_ON = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    """What a command's flags and environment say beyond its recipe, as every process of a run sees it."""

    debug: bool = False                     # --debug: tracebacks instead of short messages
    verbose: bool = False                   # --verbose: library warnings on the console
    trust_code: bool = False                # --trust-code: a recipe may name Python code
    trust_source: str = ""                  # how the trust was given, for messages
    cache_dir: str | None = None            # where caches live (default ~/.cache/recipeforge)
    progress_interval: float = PROGRESS_INTERVAL
    fault: str = ""                         # a test fault (`outputs.atomic`), empty in real runs
    service_timeout: float = SERVICE_TIMEOUT  # `outputs.services`: seconds per request

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings a command started by a user reads from its environment."""
        env = os.environ if environ is None else environ
        trust = env.get(TRUST_ENV, "").strip().lower() in _ON
        interval = _positive(env.get(PROGRESS_INTERVAL_ENV), PROGRESS_INTERVAL)
        return cls(debug=env.get(DEBUG_ENV, "") not in ("", "0"), verbose=env.get(VERBOSE_ENV, "") not in ("", "0"),
                   trust_code=trust, trust_source=f"--trust-code ({TRUST_ENV}={env.get(TRUST_ENV)})" if trust else "",
                   cache_dir=env.get(CACHE_ENV) or None, progress_interval=interval, fault=env.get(FAULT_ENV, ""),
                   service_timeout=_positive(env.get(SERVICE_TIMEOUT_ENV), SERVICE_TIMEOUT))

    def cache_root(self) -> Path:
        """The cache folder: `cache_dir`, else ~/.cache/recipeforge."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path.home() / ".cache" / "recipeforge"


def _positive(raw: str | None, default: float) -> float:
    """A positive number of seconds from a variable, else `default`."""
    try:
        value = float(raw) if raw is not None else default
    except ValueError:
        return default
    return value if value > 0 else default


_installed: list[Settings] = []


def current() -> Settings:
    """The settings of this process: a worker's from its spec, else read from the environment now."""
    return _installed[-1] if _installed else Settings.from_environment()


@contextmanager
def installed(settings: Settings) -> Iterator[Settings]:
    """`settings` answer `current()` inside the block (a worker runs in it; nothing asks the environment)."""
    _installed.append(settings)
    try:
        yield settings
    finally:
        _installed.pop()
