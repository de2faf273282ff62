"""The planner: hardware + model size + memory model -> backend choice with reasons. No torch here.

    hw = hardware_for(recipe, "8xH100-80GB")     # or parse_hardware(...), probe_local_hardware()
    plan = make_plan(recipe, hw)                  # Plan: backend, sizes, batch split, GB per GPU, reasons
    print(render_plan(plan)); plan.to_dict()      # table / JSON

The memory formulas and the preference order are documented in docs/planner.md.
"""

from recipeforge.plan.hardware import (ACCELERATORS, Accelerator, Hardware, hardware_for, parse_hardware,
                                       probe_local_hardware)
from recipeforge.plan.plan import make_plan
from recipeforge.plan.render import render_plan
from recipeforge.plan.types import Choice, Plan

__all__ = [
    "ACCELERATORS", "Accelerator", "Choice", "Hardware", "Plan", "hardware_for", "make_plan", "parse_hardware",
    "probe_local_hardware", "render_plan",
]
