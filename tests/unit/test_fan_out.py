"""Fan-out: how many other recipeforge modules one module imports. A module that needs more than a
reader can hold (12) does more than one job, and is split by job.

Imports are those `test_layering` reads with `ast`: at the top of the module, inside functions (a late
import still couples the two modules), under ``if TYPE_CHECKING:`` and by literal
``importlib.import_module``. Each distinct target counts once; a package counts as its ``__init__``.
`OVER` lists the modules still above the limit with their count today: none may grow, a module that
gets down to the limit leaves the list, and no other module may go over.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_layering import imports_of, package_imports  # noqa: E402

LIMIT = 12
OVER: dict[str, int] = {}


def fan_out() -> dict[str, set[str]]:
    """Each module's distinct recipeforge imports (itself excluded)."""
    found: dict[str, set[str]] = defaultdict(set)
    for imp in package_imports():
        if imp.target != imp.source:
            found[imp.source].add(imp.target)
    return found


def test_no_module_imports_more_than_a_reader_holds():
    counts = {module: len(targets) for module, targets in fan_out().items()}
    new = {m: n for m, n in counts.items() if n > LIMIT and m not in OVER}
    grown = {m: (OVER[m], counts.get(m, 0)) for m in OVER if counts.get(m, 0) > OVER[m]}
    done = sorted(m for m in OVER if counts.get(m, 0) <= LIMIT)
    assert not new, f"over {LIMIT} imports: {new}; split these modules by what they do"
    assert not grown, f"fan-out grew (listed, now): {grown}"
    assert not done, f"at or under {LIMIT} now: remove {done} from OVER"


def test_a_late_import_counts_as_one():
    source = '''
from recipeforge import errors
from recipeforge.log import log
import recipeforge.plan.types

def f():
    from recipeforge.log import log
    from recipeforge.outputs import run_dir
'''
    targets = {i.target for i in imports_of("recipeforge.x", source, "x.py")}
    assert targets == {"recipeforge.errors", "recipeforge.log", "recipeforge.plan.types", "recipeforge.outputs.run_dir"}
