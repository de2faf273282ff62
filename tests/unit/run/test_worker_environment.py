"""A worker reads no ``RECIPEFORGE_*`` environment variable: everything it is told is in its spec.

Every module the worker entry (`recipeforge.run.worker`) can import, at the top or inside a function
(the import graph `test_layering` reads with `ast`), is searched for environment reads whose name is a
``RECIPEFORGE_`` string, written out or through a constant: ``os.environ.get(N)``, ``os.environ[N]``,
``os.getenv(N)``, ``N in os.environ``, and a scan of the environment by the ``RECIPEFORGE_`` prefix.
Two modules may read them, each for a reason a worker never meets: `settings` (the command a user
types; a worker installs its spec's settings first) and `config.overrides` (a worker loads its recipe
with an environment stripped of ``RECIPEFORGE_`` names, the spec's values in their place). The runtime
half of that promise is tested in test_worker_spec.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_layering import PACKAGE, imports_of, module_name  # noqa: E402

ENTRY = "recipeforge.run.worker"
ALLOWED = {"recipeforge.settings", "recipeforge.config.overrides"}
PREFIX = "RECIPEFORGE_"


def _modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def worker_modules() -> set[str]:
    """Every recipeforge module the worker entry may import, directly or through others."""
    files = _modules()
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        edges[name] = {i.target for i in imports_of(name, path.read_text(), str(path), path.name == "__init__.py")}
    seen, todo = set(), [ENTRY]
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        todo += edges[name]
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a module runs its packages
    return seen


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound to a ``RECIPEFORGE_`` string (``FAULT_ENV = "RECIPEFORGE_FAULT"``)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and node.value.value.startswith(PREFIX):
                    found[target.id] = node.value.value
        if isinstance(node, ast.ImportFrom) and node.module == "recipeforge.settings":
            for alias in node.names:
                if alias.name.endswith("_ENV"):
                    found[alias.asname or alias.name] = alias.name
    return found


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                           and node.id in ("environ", "env"))


def _scans_environ(node: ast.AST) -> bool:
    """`os.environ`, `os.environ.items()`, `sorted(os.environ)` ...: a loop over the environment."""
    if isinstance(node, ast.Call):
        inner = node.func.value if isinstance(node.func, ast.Attribute) else (node.args[0] if node.args else node)
        return _is_environ(inner)
    return _is_environ(node)


def environment_reads(source: str, filename: str) -> list[str]:
    """`file:line name` for every read of a ``RECIPEFORGE_`` variable in `source`."""
    tree = ast.parse(source, filename)
    consts = _constants(tree)

    def named(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PREFIX):
            return node.value
        if isinstance(node, ast.Name) and node.id in consts:
            return consts[node.id]
        if isinstance(node, ast.JoinedStr) and node.values and named(node.values[0]):
            return "RECIPEFORGE_..."
        return None

    reads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and _is_environ(func.value):
                name = named(node.args[0])
            elif isinstance(func, ast.Attribute) and func.attr == "getenv":
                name = named(node.args[0])
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            name = named(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In) for op in node.ops) \
                and any(_is_environ(c) for c in node.comparators):
            name = named(node.left)
        elif isinstance(node, ast.comprehension) and _scans_environ(node.iter):  # a scan by the prefix
            name = next((named(c.args[0]) for c in node.ifs if isinstance(c, ast.Call) and c.args
                         and isinstance(c.func, ast.Attribute) and c.func.attr == "startswith"), None)
        if name is not None:
            line = node.iter.lineno if isinstance(node, ast.comprehension) else getattr(node, "lineno", 0)
            reads.append((line, f"{filename}:{line} {name}"))
    return [text for _, text in sorted(reads)]


def test_no_worker_module_reads_a_recipeforge_variable():
    files = _modules()
    modules = worker_modules()
    assert {"recipeforge.run.session", "recipeforge.stages.divergence", "recipeforge.outputs.atomic",
            "recipeforge.components.lm_data", "recipeforge.backends.data_ready", "recipeforge.registry"} <= modules
    reads = [read for name in sorted(modules - ALLOWED)
             for read in environment_reads(files[name].read_text(), str(files[name].relative_to(PACKAGE.parent)))]
    assert not reads, "a worker reads these RECIPEFORGE_* variables (carry them in the WorkerSpec):\n" + "\n".join(reads)


def test_the_search_finds_every_shape_of_read():
    source = '''
import os
from recipeforge.settings import FAULT_ENV
CACHE = "RECIPEFORGE_CACHE"
a = os.environ.get("RECIPEFORGE_VERBOSE", "")
b = os.environ[CACHE]
c = os.getenv("RECIPEFORGE_DEBUG")
d = "RECIPEFORGE_TRUST_CODE" in os.environ
e = [k for k in os.environ if k.startswith("RECIPEFORGE_")]
kept = {k: v for k, v in os.environ.items() if not k.startswith("RECIPEFORGE_")}
checked = [k for k in spec_keys if k.startswith("RECIPEFORGE_")]
f = environ.get(FAULT_ENV)
g = os.environ.get("HF_HOME")
os.environ["RECIPEFORGE_X"] = "1"
'''
    reads = environment_reads(source, "m.py")
    assert [r.split()[1] for r in reads] == ["RECIPEFORGE_VERBOSE", "RECIPEFORGE_CACHE", "RECIPEFORGE_DEBUG",
                                              "RECIPEFORGE_TRUST_CODE", "RECIPEFORGE_", "FAULT_ENV"]
