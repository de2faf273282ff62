"""One generic registry for every kind of pluggable component.

Built-ins register with `Registry.register(name, obj)`; plugins publish entry points in the group
``recipeforge.<registry name>`` (e.g. ``recipeforge.rewards``). Entry points are only imported when a
recipe asks for a name that is not built in, or when everything is listed (`recipeforge plugins`).
Two sources registering the same name is an error that names both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, TypeVar

from recipeforge.errors import RecipeError, did_you_mean

T = TypeVar("T")
BUILTIN = "recipeforge"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered component and the distribution that provides it."""

    name: str
    obj: T
    source: str  # distribution name, "recipeforge" for built-ins
    version: str | None = None


@dataclass(frozen=True)
class EntryPointInfo:
    """A plugin entry point that has not necessarily been loaded yet."""

    name: str
    distribution: str
    version: str | None
    value: str


class Registry(Generic[T]):
    """Named components of one kind (models, kernels, rewards, formats, rollout_engines, backends)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.group = f"recipeforge.{kind}"
        self._entries: dict[str, Entry[T]] = {}
        self._failed: dict[str, str] = {}  # entry-point name -> why loading failed

    def register(self, name: str, obj: T, source: str = BUILTIN, version: str | None = None) -> T:
        """Register `obj` under `name`; a second source for the same name is an error."""
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise RecipeError(f"{self.kind} '{name}' is registered twice: by {old.source} and by {source}",
                              hint=f"uninstall one of the two distributions ({old.source}, {source})")
        self._entries[name] = Entry(name, obj, source, version)
        return obj

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object as a built-in."""
        return lambda obj: self.register(name, obj)

    def entry_points(self) -> list[EntryPointInfo]:
        """Plugin entry points of this group (not imported)."""
        from importlib import metadata

        out = []
        for ep in metadata.entry_points(group=self.group):
            dist = ep.dist.name if ep.dist is not None else "?"
            version = ep.dist.version if ep.dist is not None else None
            out.append(EntryPointInfo(ep.name, dist, version, ep.value))
        return out

    def _load_entry_point(self, name: str) -> bool:
        from importlib import metadata

        candidates = [ep for ep in metadata.entry_points(group=self.group) if ep.name == name]
        if len(candidates) > 1:
            dists = [ep.dist.name if ep.dist else ep.value for ep in candidates]
            raise RecipeError(f"{self.kind} '{name}' is provided by several plugins: {', '.join(dists)}",
                              hint="uninstall all but one of them")
        if not candidates:
            return False
        ep = candidates[0]
        dist = ep.dist.name if ep.dist is not None else ep.value
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            self._failed[name] = f"{type(exc).__name__}: {exc}"
            raise RecipeError(f"{self.kind} '{name}' from plugin {dist} failed to load: {exc}",
                              hint=f"reinstall or fix the plugin {dist}") from None
        self.register(name, obj, source=dist, version=ep.dist.version if ep.dist else None)
        return True

    def get(self, name: str, *, key: str | None = None, location: Any = None) -> T:
        """The component called `name`, loading a plugin entry point if needed."""
        if name not in self._entries and not self._load_entry_point(name):
            known = self.names()
            hint = did_you_mean(name, known) or f"available: {', '.join(known) or 'none'}"
            raise RecipeError(f"unknown {self.kind[:-1] if self.kind.endswith('s') else self.kind} '{name}'",
                              hint=hint, key=key, location=location)
        return self._entries[name].obj

    def entry(self, name: str) -> Entry[T]:
        self.get(name)
        return self._entries[name]

    def names(self) -> list[str]:
        """Built-in and plugin names (plugins listed without importing them)."""
        return sorted(set(self._entries) | {ep.name for ep in self.entry_points()})

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(list(self._entries.values()))

    @property
    def failures(self) -> dict[str, str]:
        return dict(self._failed)
