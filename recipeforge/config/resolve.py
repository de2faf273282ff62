"""``${...}`` interpolation (OmegaConf grammar) and ``???`` required values.

``${train.learning_rate}`` refers to another key, ``${env:HF_TOKEN}`` / ``${env:VAR,default}`` to an
environment variable. Every unresolvable or missing value is reported at its own key. The names of
environment variables read per key are kept so that secrets can be redacted from outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recipeforge.config.tree import ConfigTree, leaves as tree_leaves
from recipeforge.errors import Problem, RecipeError, format_key
from recipeforge.json_value import JSONValue

if TYPE_CHECKING:
    from omegaconf import DictConfig, ListConfig

MISSING = "???"
_NO_DEFAULT = object()
_env_reads: list[str] = []  # filled by the env resolver while one key resolves


def _env_resolver(name: str, default: object = _NO_DEFAULT) -> Any:
    _env_reads.append(name)
    if name in os.environ:
        return os.environ[name]
    if default is not _NO_DEFAULT:
        return default
    raise KeyError(f"environment variable {name} is not set")


def _register_env_resolver(omegaconf) -> None:
    # omegaconf 2.4 renamed the registration call; 2.3 only has the old name.
    if hasattr(omegaconf, "register_resolver"):
        omegaconf.register_resolver("env", _env_resolver, replace=True, use_cache=False, annotation_validation="off")
    else:  # pragma: no cover - omegaconf < 2.4
        omegaconf.register_new_resolver("env", _env_resolver, replace=True, use_cache=False)


def _needs_resolving(value: object) -> bool:
    return isinstance(value, str) and ("${" in value or value == MISSING)


class UnresolvedValues(RecipeError):
    """Interpolations that could not be resolved; `partial` is the tree without those keys, so that
    validation can still report the recipe's other problems in the same run."""

    def __init__(self, problems: list[Problem], partial: ConfigTree, paths: list[tuple]):
        super().__init__(problems)
        self.partial = partial
        self.paths = paths


def resolve_interpolations(tree: ConfigTree, defaults: dict | None = None) -> tuple[ConfigTree, dict[tuple, list[str]]]:
    """Return a tree with every interpolation resolved, and the env variables each key read.

    `defaults` (schema defaults) are visible to references but never copied into the result.

    Raises `UnresolvedValues` (a `RecipeError`) naming every key that could not be resolved.
    """
    leaves = [(p, v) for p, v in tree_leaves(tree.data) if _needs_resolving(v)]
    if not leaves:
        return tree, {}
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register_env_resolver(OmegaConf)
    out = tree.copy()
    failures = _Failures(sane=tree.copy())
    leaves = _parsed_leaves(tree, leaves, failures)
    leaves = _bounded_leaves(tree, leaves, defaults or {}, failures)
    try:
        cfg = OmegaConf.create(_overlay(defaults or {}, failures.sane.data))
    except OmegaConfBaseException as exc:
        raise RecipeError(f"cannot interpolate this recipe: {_short(exc)}", location=tree.root) from None
    env_refs = _resolve_leaves(tree, cfg, leaves, out, failures)
    if failures.problems:
        raise UnresolvedValues(failures.problems, out, failures.paths)
    return out, env_refs


@dataclass
class _Failures:
    """The keys that could not be resolved so far: a problem and the path of each, and `sane`, the tree
    with the keys found before OmegaConf reads it set to None (so that it can read the rest)."""

    sane: ConfigTree
    problems: list[Problem] = field(default_factory=list)
    paths: list[tuple] = field(default_factory=list)

    def add(self, problem: Problem, path: tuple, *, blank: bool = False) -> None:
        """Record `problem` at `path`; `blank` also sets the key to None in `sane`."""
        self.problems.append(problem)
        self.paths.append(path)
        if blank:
            self.sane.get(path[:-1])[path[-1]] = None

    def without_failed(self, leaves: list) -> list:
        """`leaves` less the keys that failed."""
        return [(p, v) for p, v in leaves if p not in self.paths]


def _parsed_leaves(tree: ConfigTree, leaves: list, failures: _Failures) -> list:
    """The leaves whose interpolations parse; each other one is a failure."""
    from omegaconf.errors import OmegaConfBaseException
    from omegaconf.grammar_parser import parse as parse_interpolation

    # Malformed interpolations would make OmegaConf reject the whole document: find them one by one.
    for path, raw in leaves:
        try:
            parse_interpolation(raw)
        except OmegaConfBaseException as exc:
            failures.add(Problem(f"bad interpolation syntax in {raw!r}: {_short(exc)}", tree.locate(path),
                                 format_key(path), hint="write ${section.key} or ${env:VAR,default}; "
                                                        "a literal '${' is written '\\${'"), path, blank=True)
    return failures.without_failed(leaves)


def _bounded_leaves(tree: ConfigTree, leaves: list, defaults: dict, failures: _Failures) -> list:
    """The leaves within the interpolation limits; each other one is a failure."""
    # Chains, cycles, expansion size and resolvers are checked on the plain tree: OmegaConf would
    # recurse past Python's limit or build huge strings before it noticed.
    from recipeforge.config.interpolation_limits import check_interpolations

    for problem in check_interpolations(tree, leaves, defaults):
        path = next(p for p, _ in leaves if format_key(p) == problem.key)
        failures.add(problem, path, blank=True)
    return failures.without_failed(leaves)


def _resolve_leaves(tree: ConfigTree, cfg: DictConfig | ListConfig, leaves: list, out: ConfigTree, failures: _Failures) -> dict:
    """Write each leaf's resolved value into `out`; returns the env variables each key read."""
    env_refs: dict[tuple, list[str]] = {}
    for path, raw in leaves:
        _env_reads.clear()
        value, problem = _resolve_leaf(tree, cfg, path, raw)
        if problem is None and isinstance(value, str) and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
            # Bytes that were not UTF-8 in an environment variable: no file or terminal could hold them.
            problem = Problem(f"{', '.join(_env_reads) or 'the value'} is not UTF-8 text", tree.locate(path),
                              format_key(path), hint="set the variable to UTF-8 text")
        if problem is not None:
            failures.add(problem, path)
            continue
        if _env_reads:
            env_refs[path] = list(_env_reads)
        out.get(path[:-1])[path[-1]] = value
    return env_refs


def _resolve_leaf(tree: ConfigTree, cfg: DictConfig | ListConfig, path: tuple, raw: str) -> tuple[Any, Problem | None]:
    """The value of `path` in `cfg` (containers resolved whole), or the problem that stopped it."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    try:
        node: Any = cfg
        for part in path[:-1]:
            node = node[part]
        value = node[path[-1]]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue:
        return None, Problem("required value is missing (???)", tree.locate(path), format_key(path),
                             hint=f"set it in the recipe or on the command line: {format_key(path)}=...")
    except RecursionError:  # the limits (`_bounded_leaves`) were not enough: still this key's problem, not a crash
        return None, Problem("interpolation nests too deeply to resolve", tree.locate(path), format_key(path),
                             hint="refer to the key that holds the value directly")
    except OmegaConfBaseException as exc:
        return None, Problem(f"cannot resolve {raw!r}: {_short(exc)}", tree.locate(path), format_key(path),
                             hint="interpolations look like ${train.learning_rate} or ${env:VAR,default}")
    return value, None


def _overlay(base: JSONValue, over: JSONValue) -> JSONValue:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _overlay(base.get(k), v) for k, v in over.items()}}
    return over


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.replace("Interpolation key ", "key ").rstrip(".")
