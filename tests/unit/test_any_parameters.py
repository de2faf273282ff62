"""Parameters typed `Any`: how many functions of recipeforge still take a parameter annotated exactly
``Any``, against a ceiling that only goes down.

Counted with `ast` (nothing is imported): every ``def`` and ``async def`` in ``recipeforge/**/*.py``,
methods and nested functions included; each positional-only, positional and keyword-only parameter
whose annotation unparses to ``Any`` counts once (``*args: Any`` and ``**kwargs: Any`` do not count, nor
an alias or a union that holds ``Any``). To see them::

    python -m pytest tests/unit/test_any_parameters.py -q   # the failure lists them by file

A parameter gets its real type instead: ``torch.nn.Module``, a transformers class imported under
``if TYPE_CHECKING:``, the project's own records, a ``Protocol`` for a duck-typed seam,
`recipeforge.json_value.JSONValue` for parsed YAML/JSON, or ``object`` where anything is accepted
and only passed on or checked with ``isinstance``. When the count goes down, lower `CEILING` to it;
never raise it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import recipeforge

PACKAGE = Path(recipeforge.__file__).resolve().parent
CEILING = 32


def any_parameters(source: str) -> list[tuple[int, str, str]]:
    """(line, function, parameter) of every parameter annotated exactly ``Any`` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                if arg.annotation is not None and ast.unparse(arg.annotation) == "Any":
                    found.append((node.lineno, node.name, arg.arg))
    return found


def package_any_parameters() -> dict[str, list[tuple[int, str, str]]]:
    """File (relative to the repository) -> its `Any` parameters, for every module of recipeforge."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = any_parameters(path.read_text(encoding="utf-8"))
        if found:
            out[str(path.relative_to(PACKAGE.parent))] = found
    return out


def test_any_parameters_stay_under_the_ceiling():
    found = package_any_parameters()
    count = sum(len(v) for v in found.values())
    listing = "\n".join(f"  {f}:{line} {name}({param})" for f, items in found.items() for line, name, param in items)
    assert count <= CEILING, (f"{count} parameters typed Any, the ceiling is {CEILING}: give the new ones a "
                              f"real type\n{listing}")


def test_the_counter_sees_every_kind_of_parameter():
    source = '''
from typing import Any
def f(a: Any, /, b: Any, *args: Any, c: Any = None, d: "Any | None" = None, **kwargs: Any) -> Any: ...
class C:
    async def g(self, x: Any, y: object, z: list[Any]) -> None:
        def inner(w: Any) -> None: ...
'''
    assert sorted(p for _, _, p in any_parameters(source)) == ["a", "b", "c", "w", "x"]
