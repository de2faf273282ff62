"""One generic registry for every kind of pluggable component.

Built-ins register with `Registry.register(name, obj)`; plugins publish entry points in the group
``recipeforge.<kind>`` (e.g. ``recipeforge.rewards``) and are registered the same way once loaded.
Entry points are read (not imported) only when a recipe names something that is not built in, and
imported only when that name is used, or when everything is listed (`recipeforge plugins`).

Clashes are errors that name both sources: two distributions publishing one name, or a plugin
publishing a built-in's name (the plugin is refused and `recipeforge plugins` says why).

A recipe can only name registered components. The one way around it, importing the user's own code
by dotted path (``my_module:function``), needs an explicit opt-in: see `code_trust`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from recipeforge.errors import Location, RecipeError, did_you_mean

T = TypeVar("T")
BUILTIN = "recipeforge"

@dataclass(frozen=True)
class RegistryKind:
    """A kind of component: what its entries are, and the module that defines its registry and
    registers the built-ins (importing it does both; it imports neither torch nor transformers)."""

    description: str
    module: str


# The one table of registries: every entry-point group ``recipeforge.<kind>`` recipeforge reads.
REGISTRY_KINDS: dict[str, RegistryKind] = {
    "models": RegistryKind("model ids the planner can size (architecture specs), optionally with a loader",
                           "recipeforge.plan.catalog"),
    "kernels": RegistryKind("optional kernels a recipe enables under `kernels:`", "recipeforge.components.kernels"),
    "rollout_engines": RegistryKind("GRPO completion generators named by `grpo.rollout.engine`",
                                    "recipeforge.components.rollout"),
    "rewards": RegistryKind("GRPO reward functions named in `grpo.rewards`", "recipeforge.components.rewards"),
    "environments": RegistryKind("multi-turn tool environments named by `grpo.environment.name`",
                                 "recipeforge.components.environments"),
    "formats": RegistryKind("dataset row layouts named by `data.datasets[].format`", "recipeforge.components.formats"),
    "backends": RegistryKind("distributed backends", "recipeforge.backends"),
    "recipes": RegistryKind("packages holding base recipes for `extends: pkg://<name>/<file>.yaml`",
                            "recipeforge.config.plugin_recipes"),
    "stages": RegistryKind("training stages named by `stage:` (a `stage_specs.StageSpec` each)",
                           "recipeforge.stage_specs"),
}
GROUPS: dict[str, str] = {kind: k.description for kind, k in REGISTRY_KINDS.items()}

# Components of recipeforge's own plugin packages. A recipe may name them before the plugin is
# installed, so that a recipe written for a GPU cluster validates and plans on a laptop; using one
# (training) needs the plugin, and the error says which package to install.
FIRST_PARTY: dict[str, dict[str, str]] = {
    "kernels": {"liger": "recipeforge-liger"},
    "rollout_engines": {"vllm": "recipeforge-vllm"},
    "backends": {"zero_redundancy": "recipeforge-zero-redundancy"},
}

from recipeforge.settings import TRUST_ENV as TRUST_ENV  # noqa: E402 - the variable --trust-code sets
OPT_IN_HINT = (f"if you trust it, set allow_code: true at the top of the recipe, or pass --trust-code "
               f"(environment variable {TRUST_ENV}=1)")


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


_ENTRY_POINTS: dict[str, list] = {}  # group -> [(EntryPointInfo, EntryPoint)], read once per process
_REGISTRIES: dict[str, "Registry"] = {}


def refresh_entry_points() -> None:
    """Forget the entry points read so far, and the plugin components loaded from them (built-ins
    stay): for a process that installs or removes plugins while it runs (tests, notebooks)."""
    import importlib

    _ENTRY_POINTS.clear()
    for registry in _REGISTRIES.values():
        registry._forget_plugins()
    importlib.invalidate_caches()


def group_entry_points(group: str) -> list:
    """``(EntryPointInfo, EntryPoint)`` pairs of `group`, without importing anything."""
    if group not in _ENTRY_POINTS:
        from importlib import metadata

        seen, out = set(), []
        for ep in metadata.entry_points(group=group):
            dist = ep.dist.name if ep.dist is not None else "?"
            # The same distribution can be visible twice (e.g. two sys.path entries): one entry.
            if (dist, ep.name, ep.value) in seen:
                continue
            seen.add((dist, ep.name, ep.value))
            out.append((EntryPointInfo(ep.name, dist, ep.dist.version if ep.dist else None, ep.value), ep))
        _ENTRY_POINTS[group] = out
    return _ENTRY_POINTS[group]


def registry_for(kind: str) -> "Registry":
    """The registry of `kind`, its built-ins registered: the module `REGISTRY_KINDS` names for it is
    imported first, so the registry returned is always the one that module defines."""
    if kind not in _REGISTRIES:
        if kind not in REGISTRY_KINDS:
            raise KeyError(f"no registry of kind {kind!r} (kinds: {', '.join(REGISTRY_KINDS)})")
        import importlib

        importlib.import_module(REGISTRY_KINDS[kind].module)
    return _REGISTRIES[kind]


class Registry(Generic[T]):
    """Named components of one kind (models, kernels, rewards, formats, rollout_engines, backends, stages).

    `coerce(name, obj)` turns what a plugin's entry point gives into the registry's type (e.g. a
    plain function into a kernel spec) and raises TypeError when it cannot.
    """

    def __init__(self, kind: str, coerce: Callable[[str, Any], T] | None = None):
        self.kind = kind
        self.group = f"recipeforge.{kind}"
        self.label = {"rollout_engines": "rollout engine", "recipes": "recipe package"}.get(
            kind, kind[:-1] if kind.endswith("s") else kind)
        self._coerce = coerce
        self._entries: dict[str, Entry[T]] = {}
        self._raw: dict[str, Any] = {}       # name -> the object as registered (before coerce)
        self._failed: dict[str, str] = {}  # entry-point name -> why loading failed
        if kind in REGISTRY_KINDS:  # the module-level registry of a declared kind is the one
            _REGISTRIES.setdefault(kind, self)

    # -- registering -----------------------------------------------------------------------------
    def register(self, name: str, obj: object, source: str = BUILTIN, version: str | None = None) -> T:
        """Register `obj` under `name`; a second source for the same name is an error naming both."""
        old = self._entries.get(name)
        if old is not None:
            if self._raw[name] is obj:
                return old.obj  # registering the same object again is harmless
            raise RecipeError(f"{self.label} '{name}' is registered twice: by {old.source} and by {source}",
                              hint=f"uninstall one of the two distributions ({old.source}, {source})")
        coerced = self._coerce(name, obj) if self._coerce is not None else obj
        self._raw[name] = obj
        self._entries[name] = Entry(name, coerced, source, version)
        return coerced

    def _forget_plugins(self) -> None:
        for name in [n for n, e in self._entries.items() if e.source != BUILTIN]:
            del self._entries[name], self._raw[name]
        self._failed.clear()

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object as a built-in."""
        def wrap(obj):
            self.register(name, obj)
            return obj
        return wrap

    # -- entry points ----------------------------------------------------------------------------
    def entry_points(self) -> list[EntryPointInfo]:
        """Plugin entry points of this group (not imported)."""
        return [info for info, _ in group_entry_points(self.group)]

    def _load_entry_point(self, name: str) -> bool:
        candidates = [(info, ep) for info, ep in group_entry_points(self.group) if info.name == name]
        if not candidates:
            return False
        dists = sorted({info.distribution for info, _ in candidates})
        if len(candidates) > 1:
            why = f"provided by several plugins: {', '.join(dists) if len(dists) > 1 else candidates[0][0].distribution}"
            self._failed[name] = why
            raise RecipeError(f"{self.label} '{name}' is {why}", hint="uninstall all but one of them")
        info, ep = candidates[0]
        try:
            obj = ep.load()
            self.register(name, obj, source=info.distribution, version=info.version)
        except RecipeError:
            raise
        except Exception as exc:  # a broken plugin must not take the others down
            self._failed[name] = f"{type(exc).__name__}: {exc}"
            raise RecipeError(f"{self.label} '{name}' from plugin {info.distribution} failed to load: "
                              f"{type(exc).__name__}: {exc}",
                              hint=f"reinstall or fix the plugin {info.distribution}") from None
        return True

    # -- looking up ------------------------------------------------------------------------------
    def get(self, name: str, *, key: str | None = None, location: Location | None = None) -> T:
        """The component called `name`, loading a plugin entry point if it is not built in."""
        entry = self._entries.get(name)
        if entry is not None:
            return entry.obj
        try:
            found = self._load_entry_point(name)
        except RecipeError as exc:
            raise RecipeError([type(p)(p.message, location, key, p.hint) for p in exc.problems]) from None
        if not found:
            raise self.unknown(name, key=key, location=location)
        return self._entries[name].obj

    def unknown(self, name: str, *, key: str | None = None, location: Location | None = None) -> RecipeError:
        """The error for a name nobody registered: did-you-mean, the plugin to install, what exists."""
        known = self.names()
        available = f"available: {', '.join(known) or 'none'}"
        plugin = self.first_party_plugin(name)
        if plugin is not None:
            return RecipeError(f"{self.label} '{name}' comes from the {plugin} plugin, which is not installed",
                               key=key, location=location, hint=f"pip install {plugin}; {available}")
        extra = {n: d for n, d in FIRST_PARTY.get(self.kind, {}).items() if n not in known}
        if extra:
            available += "; with a plugin: " + ", ".join(f"{n} (pip install {d})" for n, d in extra.items())
        close = did_you_mean(name, known + list(extra))
        return RecipeError(f"unknown {self.label} '{name}'", key=key, location=location,
                           hint=f"{close + ' ' if close else ''}{available}")

    def entry(self, name: str) -> Entry[T]:
        """The `Entry` (object, distribution, version) of `name`, loading it if needed."""
        self.get(name)
        return self._entries[name]

    def builtin_names(self) -> list[str]:
        """Names registered by recipeforge itself, in registration order."""
        return [n for n, e in self._entries.items() if e.source == BUILTIN]

    def names(self) -> list[str]:
        """Built-in names (in registration order), then plugin names (sorted); plugins are listed,
        not imported."""
        builtin = self.builtin_names()
        plugins = {n for n, e in self._entries.items() if e.source != BUILTIN}
        plugins |= {info.name for info in self.entry_points()}
        return builtin + sorted(plugins - set(builtin))

    def has(self, name: str) -> bool:
        """Whether `name` is built in or published by an installed plugin (nothing is imported)."""
        return name in self._entries or any(info.name == name for info in self.entry_points())

    def first_party_plugin(self, name: str) -> str | None:
        """The recipeforge plugin package that provides `name`, when it is not installed."""
        return None if self.has(name) else FIRST_PARTY.get(self.kind, {}).get(name)

    def __contains__(self, name: str) -> bool:
        return self.has(name)

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(list(self._entries.values()))

    @property
    def failures(self) -> dict[str, str]:
        """Entry points that failed to load, with why."""
        return dict(self._failed)

    # -- the `recipeforge plugins` view ----------------------------------------------------------
    def status(self) -> list[dict]:
        """Every built-in and plugin entry with its distribution, version and status.

        Loads every plugin entry point of the group; a broken one is reported as failed with why,
        and never stops the others from loading.
        """
        from recipeforge import __version__

        rows = [{"name": e.name, "distribution": e.source, "version": e.version or __version__, "value": None,
                 "status": "built-in", "error": None} for e in self._entries.values() if e.source == BUILTIN]
        builtin = set(self.builtin_names())
        for info in self.entry_points():
            row = {"name": info.name, "distribution": info.distribution, "version": info.version,
                   "value": info.value, "status": "loaded", "error": None}
            if info.name in builtin:
                row.update(status="failed", error=f"clashes with the built-in {self.label} '{info.name}' "
                                                  f"of recipeforge; the built-in is used")
            else:
                try:
                    self.get(info.name)
                except RecipeError as exc:
                    row.update(status="failed", error=self._failed.get(info.name) or exc.problems[0].message)
                else:
                    if self._entries[info.name].source != info.distribution:
                        row.update(status="failed", error=f"clashes with {self._entries[info.name].source}")
            rows.append(row)
        return rows


# -- user code by dotted path ------------------------------------------------------------------------

def is_code_reference(name: str) -> bool:
    """Whether `name` is a ``module:attribute`` reference to Python code rather than a registered name."""
    return ":" in name


def code_trust(allow_code: bool = False, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether a recipe may import Python code by dotted path, and why.

    Two ways to opt in: the recipe's ``allow_code: true``, or the environment variable
    ``RECIPEFORGE_TRUST_CODE=1`` (what the CLI's ``--trust-code`` sets). Without either, a recipe can
    name registered components only.
    """
    from recipeforge.settings import Settings, current

    if allow_code:
        return True, "the recipe sets allow_code: true"
    # A worker's settings come from its spec (the launching command's flag), never its environment.
    settings = current() if environ is None else Settings.from_environment(environ)
    if settings.trust_code:
        return True, settings.trust_source or "--trust-code (the launching command's)"
    return False, "off: the recipe may name registered components only"


# Everything a recipe or a command line can name that runs Python code, each behind `require_code_trust`
# (docs/reliability.md lists them for users). Installed plugins are not here: installing a distribution
# is the opt-in to its code. Chat templates are not either: transformers renders them in Jinja's
# immutable sandbox, which refuses attribute access to Python internals.
CODE_SITES: dict[str, str] = {
    "grpo.rewards[].name": "a reward given as `module:function` is imported and called",
    "model.trust_remote_code": "transformers imports the Python files of the model's repository",
    "grpo.rewards[].args.trust_remote_code": "the `reward_model` reward loads its model with remote code",
    "eval.tasks / eval --tasks (.yaml)": "lm-eval renders a task file's templates with unsandboxed Jinja, imports "
                                         "its `!function` modules and follows its `include:` chain",
    "a run's resolved_recipe.yaml": "merge and export load the base model with the run's model.trust_remote_code",
}


def code_trust_problem(what: str, allow_code: bool = False, environ: Mapping[str, str] | None = None) -> str | None:
    """Why `what` (a description such as "reward 'm:f' is Python code") may not run, or None when the
    user opted in: the message every refusal of code shares (see `require_code_trust`)."""
    if code_trust(allow_code, environ)[0]:
        return None
    return f"{what}, and running code needs an opt-in (allow_code)"


def require_code_trust(what: str, *, allow_code: bool = False, key: str | None = None,
                       location: Location | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The one gate in front of code a recipe or a command line names (`CODE_SITES`): returns why it
    may run (the recipe's ``allow_code: true``, or ``--trust-code``), or raises a `RecipeError` at
    `key`/`location` with the opt-in hint. `what` says what the code is, e.g. "task file x.yaml is an
    lm-eval config (Jinja templates, !function)"."""
    problem = code_trust_problem(what, allow_code, environ)
    if problem is not None:
        raise RecipeError(problem, key=key, location=location, hint=OPT_IN_HINT)
    return code_trust(allow_code, environ)[1]


def check_code_reference(ref: str) -> str | None:
    """Why `ref` is not a well-formed ``package.module:attribute`` reference (None when it is)."""
    module, _, attr = ref.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        return f"'{ref}' is not a Python reference of the form package.module:function"
    return None


def import_code(ref: str, *, allowed: bool, what: str, key: str | None = None,
                location: Location | None = None, search_dir: str | None = None) -> Any:
    """Import the object ``module:attribute`` names, only when the user opted in.

    `search_dir` (the directory of the recipe that names the code) is tried after `sys.path`, so a
    module kept next to its recipe is found without installing it.
    """
    require_code_trust(f"{what} '{ref}' is Python code", allow_code=allowed, key=key, location=location)
    bad = check_code_reference(ref)
    if bad:
        raise RecipeError(bad, key=key, location=location, hint="e.g. my_rewards:format_reward")
    import importlib
    import sys

    module, _, attr = ref.partition(":")
    try:
        try:
            obj: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not search_dir or exc.name != module.split(".")[0]:
                raise
            if search_dir not in sys.path:
                sys.path.append(search_dir)  # kept: the module may import its siblings later
            obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # the user's module failing to import is the user's problem to see
        raise RecipeError(f"cannot import {what} '{ref}': {type(exc).__name__}: {exc}", key=key, location=location,
                          hint="the module must be importable (installed, on PYTHONPATH, or next to the recipe)") \
            from None
    return obj
