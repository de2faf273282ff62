"""What planning really imports, in a fresh interpreter (the layering test reads import statements, and a
module named by a table escapes it): the plan layer alone loads no backend, stage, run or tool module; a
plan made with the installed backends loads their specs' modules and still nothing of the stages, the run
or the tools."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UPPER = ("recipeforge.backends", "recipeforge.stages", "recipeforge.run", "recipeforge.outputs", "recipeforge.tools",
         "recipeforge.cli")


def _loaded(code: str) -> list[str]:
    script = f"import sys\n{code}\nprint(sorted(m for m in sys.modules if m.startswith({UPPER!r})))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return eval(done.stdout.strip().splitlines()[-1])  # a list literal printed by the script above


def test_importing_the_plan_layer_loads_nothing_above_it():
    assert _loaded("import recipeforge.plan, recipeforge.plan.world, recipeforge.plan.planners") == []


def test_a_plan_loads_the_backend_specs_and_nothing_of_the_stages_the_run_or_the_tools():
    """With recipeforge's own backends: installed plugins are hidden (a plugin's backend imports what it
    likes, and validating a recipe reads every backend's capabilities)."""
    loaded = _loaded("sys.path.insert(0, 'tests')\n"
                     "from plugin_testing import only_plugins\n"
                     "from recipeforge.config import load_recipe\n"
                     "from recipeforge.plan import make_plan, parse_hardware\n"
                     "with only_plugins():\n"
                     "    make_plan(load_recipe('examples/yaml/llama3-70b-full-sft.yaml').recipe,"
                     " parse_hardware('2x8xH100-80GB'))")
    assert "recipeforge.backends.fsdp" in loaded  # the specs the planner was handed
    assert [m for m in loaded if not m.startswith("recipeforge.backends")] == [], loaded
