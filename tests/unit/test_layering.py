"""The package's layers: every import points down, and no module imports itself back.

Each module of recipeforge is read with `ast` (nothing is imported), and every import it holds is
collected: module-level ones, the ones inside functions (where the heavy and the late imports live),
the ones under ``if TYPE_CHECKING:`` and ``importlib.import_module("recipeforge....")`` calls with a
literal name. Each module belongs to one layer; `ALLOWED` says, as data, which layers a layer may
import. docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import recipeforge

PACKAGE = Path(recipeforge.__file__).resolve().parent

# Bottom to top. A layer may import itself and the layers listed for it, nothing else.
_BASE = {"errors"}
_REGISTRY = _BASE | {"registry"}
_COMPONENTS = _REGISTRY | {"components"}
_CONFIG = _COMPONENTS | {"config"}
_PLAN = _CONFIG | {"plan"}
_OUTPUTS = _PLAN | {"outputs"}
_STAGES = _OUTPUTS | {"stages"}
_BACKENDS = _STAGES | {"backends"}
_TOOLS = _BACKENDS | {"tools"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),                      # errors.py, and __init__.py (the version)
    "registry": _BASE,                    # the generic Registry, entry points, code trust
    "components": _REGISTRY,              # formats, kernels, rewards, rollout engines, models (their registries)
    "config": _COMPONENTS,                # recipe language; checks component names against their registries
    "plan": _CONFIG,                      # the planner, the plan for a world, presets, the trust annotation
    "outputs": _PLAN,                     # run directory, checkpoints, metrics, final weights, the LoRA merge
    "stages": _OUTPUTS,                   # stage runners: get a barrier and a saver, never a backend
    "backends": _STAGES,                  # launchers, worker plumbing, the Backend protocol
    "tools": _BACKENDS,                   # after training: export, eval, chat, serve, push, model card, reports
    "run": _TOOLS,                        # recipeforge.run: train / preprocess / merge; eval, push, card after a run
    "plugins": _BACKENDS,                 # the `recipeforge plugins` report loads every group
    "cli": _TOOLS | {"run", "plugins"},   # cli/ and __main__.py
}
# The layers a training run is made of: none of them may import the after-training tools.
TRAINING = {"components", "config", "plan", "outputs", "stages", "backends"}
# Modules outside the subpackages, by name; a new one must be placed here on purpose.
TOP_LEVEL = {"recipeforge": "errors", "recipeforge.errors": "errors", "recipeforge.credentials": "errors",
             "recipeforge.log": "errors",  # the console logger
             "recipeforge.settings": "errors",  # flags and environment beyond the recipe, one typed record
             "recipeforge.json_value": "errors",  # the type of parsed YAML/JSON; imports nothing
             "recipeforge.start_up": "errors",  # a process's start-up out of the garbage collector's way
             "recipeforge.registry": "registry",
             "recipeforge.capabilities": "registry",  # what each backend runs: read by config, plan, backends
             "recipeforge.stage_specs": "registry",  # the stages, named once, and their registry
             "recipeforge.run": "run", "recipeforge.plugins": "plugins", "recipeforge.cli": "cli",
             "recipeforge.__main__": "cli",
             "recipeforge.ray_entry": "cli"}  # a Ray launch's driver and worker function: process entry points
SUBPACKAGES = {"components", "config", "plan", "outputs", "stages", "backends", "tools"}


@dataclass(frozen=True)
class Import:
    source: str       # importing module
    target: str       # imported module (a package's __init__ when no submodule of that name exists)
    where: str        # file:line


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    path = PACKAGE.parent / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(module: str, source: str, filename: str, is_package: bool = False) -> list[Import]:
    """Every recipeforge import in `source` (the text of `module`), wherever it sits in the file."""
    found: list[tuple[int, Import]] = []

    def add(target: str, node: ast.AST) -> None:
        if target == "recipeforge" or target.startswith("recipeforge."):
            found.append((node.lineno, Import(module, target, f"{filename}:{node.lineno}")))

    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            for alias in node.names:
                # `from recipeforge.backends import worker` imports the submodule worker.
                sub = f"{parent}.{alias.name}"
                add(sub if _exists(sub) else parent, node)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node)
    # In file order, once per line (`from x import a, b` is one import of x).
    return list(dict.fromkeys(imp for _, imp in sorted(found, key=lambda pair: pair[0])))


def package_imports() -> list[Import]:
    out: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += imports_of(module_name(path), path.read_text(), str(path.relative_to(PACKAGE.parent)),
                          is_package=path.name == "__init__.py")
    return out


def layer_of(module: str) -> str | None:
    """The layer `module` belongs to (None: a top-level module nobody placed yet)."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    return TOP_LEVEL.get(".".join(parts[:2]))


def wrong_way(imports: list[Import]) -> list[str]:
    """One readable line per import that points up (or sideways) through the layers."""
    bad = []
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src is None or dst is None:
            unplaced = imp.source if src is None else imp.target
            bad.append(f"{imp.where}: {unplaced} belongs to no layer; place it in TOP_LEVEL")
        elif dst != src and dst not in ALLOWED[src]:
            bad.append(f"{imp.where}: {src} must not import {dst} ({imp.source} -> {imp.target}); "
                       f"{src} may import {', '.join(sorted(ALLOWED[src])) or 'nothing'}")
    return bad


def cycles(imports: list[Import], within: str) -> list[list[str]]:
    """Import cycles among the modules whose name starts with `within` (strongly connected groups)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.source.startswith(within) and imp.target.startswith(within) and imp.source != imp.target:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_report(groups: list[list[str]], imports: list[Import]) -> str:
    lines = []
    for group in groups:
        members = set(group)
        lines.append("cycle: " + ", ".join(group))
        lines += [f"    {i.where}: {i.source} -> {i.target}" for i in imports
                  if i.source in members and i.target in members and i.source != i.target]
    return "\n".join(lines)


# -- the package as it is ------------------------------------------------------------------------

def test_every_import_points_down_the_layers():
    imports = package_imports()
    assert len(imports) > 200  # the scan sees the package (function-local imports included)
    bad = wrong_way(imports)
    assert not bad, "imports that point the wrong way:\n" + "\n".join(bad)


def test_training_never_imports_the_tools():
    assert TRAINING <= set(ALLOWED) and all("tools" not in ALLOWED[layer] for layer in TRAINING)
    assert {"run", "cli"} <= {layer for layer, allowed in ALLOWED.items() if "tools" in allowed}
    found = [f"{i.where}: {i.source} -> {i.target}" for i in package_imports()
             if layer_of(i.source) in TRAINING and layer_of(i.target) == "tools"]
    assert not found, "training code importing an after-training tool:\n" + "\n".join(found)


def test_the_recipe_schema_has_no_import_cycle():
    imports = package_imports()
    assert any(i.source == "recipeforge.config.schema.rules" for i in imports)
    groups = cycles(imports, "recipeforge.config.schema")
    assert not groups, _cycle_report(groups, imports)


def test_the_package_has_no_import_cycle():
    imports = package_imports()
    groups = cycles(imports, "recipeforge")
    assert not groups, _cycle_report(groups, imports)


def test_every_layer_named_in_the_rules_exists():
    assert set(TOP_LEVEL.values()) | SUBPACKAGES == set(ALLOWED)
    assert all(layers <= set(ALLOWED) for layers in ALLOWED.values())
    for sub in SUBPACKAGES:
        assert (PACKAGE / sub / "__init__.py").is_file()


# -- the checker itself ----------------------------------------------------------------------------

def test_the_checker_finds_imports_anywhere_in_a_module():
    source = '''
from typing import TYPE_CHECKING
from recipeforge.errors import RecipeError
from . import base
if TYPE_CHECKING:
    from recipeforge.plan.types import Plan

def f():
    from recipeforge.backends import worker
    import recipeforge.run
    import importlib
    importlib.import_module("recipeforge.cli")
'''
    found = imports_of("recipeforge.stages.lm", source, "lm.py")
    assert [i.target for i in found] == ["recipeforge.errors", "recipeforge.stages.base", "recipeforge.plan.types",
                                         "recipeforge.backends.worker", "recipeforge.run", "recipeforge.cli"]
    bad = wrong_way(found)
    assert len(bad) == 3 and all("stages must not import" in line for line in bad)
    assert bad[0].startswith("lm.py:9: stages must not import backends (recipeforge.stages.lm -> "
                             "recipeforge.backends.worker)")
    assert wrong_way([Import("recipeforge.newmodule", "recipeforge.errors", "x.py:1")]) == [
        "x.py:1: recipeforge.newmodule belongs to no layer; place it in TOP_LEVEL"]


def test_the_checker_finds_cycles():
    imports = [Import("recipeforge.config.schema.recipe", "recipeforge.config.schema.rules", "recipe.py:3"),
               Import("recipeforge.config.schema.rules", "recipeforge.config.schema.components", "rules.py:4"),
               Import("recipeforge.config.schema.components", "recipeforge.config.schema.recipe", "components.py:5"),
               Import("recipeforge.config.validate", "recipeforge.config.schema.recipe", "validate.py:6")]
    assert cycles(imports, "recipeforge.config.schema") == [[
        "recipeforge.config.schema.components", "recipeforge.config.schema.recipe", "recipeforge.config.schema.rules"]]
    assert cycles(imports[1:], "recipeforge") == []
    assert "rules.py:4: recipeforge.config.schema.rules -> recipeforge.config.schema.components" in \
        _cycle_report(cycles(imports, "recipeforge"), imports)


LARGEST_MODULE_LINES = 500
LARGEST_CLI_MODULE_LINES = 250


def test_no_module_is_longer_than_a_reader_holds():
    """Small modules with one job: none over 500 lines, none of the command line's (cli/ and its
    packages: the MCP server, the web page) over 250."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        limit = LARGEST_CLI_MODULE_LINES if path.relative_to(PACKAGE).parts[0] == "cli" else LARGEST_MODULE_LINES
        if lines > limit:
            too_long.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines (at most {limit}); split it by job")
    assert not too_long, "\n".join(too_long)
