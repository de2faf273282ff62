"""The command plan: the backend, batch sizes and memory `train` would choose, with reasons. It imports
neither torch nor transformers."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from recipeforge.cli.common import load, recipe_args

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers
    from recipeforge.plan.types import Plan


def add_plan(sub: Subparsers) -> None:
    p = sub.add_parser("plan", help="choose backend, batch sizes and per-GPU memory for a recipe, with reasons")
    recipe_args(p)
    p.add_argument("--hardware", help="plan for this hardware instead of this machine: 8xH100-80GB, "
                                      "2x8xA100-80GB (nodes x gpus), cpu")
    p.add_argument("--nproc-per-node", type=int,
                   help="plan for this many processes per node, as `train --nproc-per-node` (CPU runs over gloo)")
    p.add_argument("--nnodes", type=int, help="plan for this many nodes, as `train --nnodes`")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)


def checked_plan(args: argparse.Namespace) -> Plan:
    """The plan `train` would make for the recipe and process layout `args` name (raises `RecipeError`)."""
    from recipeforge.plan import hardware_for, parse_hardware
    from recipeforge.plan.world import plan_for_world

    loaded = load(args)
    # The same planning `train` does for the same process layout.
    hardware = parse_hardware(args.hardware, nnodes=args.nnodes) if args.hardware else hardware_for(loaded.recipe, None)
    plan = plan_for_world(loaded.recipe, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, hardware=hardware)
    from recipeforge.components.data_checks import check_plan_numbers

    check_plan_numbers(plan)
    return plan


def plan_json(plan: Plan, indent: int | None = 2) -> str:
    """The plan as `plan --json` prints it: JSON with credentials in URLs hidden."""
    from recipeforge.credentials import redact_credentials

    return redact_credentials(json.dumps(plan.to_dict(), indent=indent, default=str))


def cmd_plan(args: argparse.Namespace) -> int:
    from recipeforge.plan import render_plan

    plan = checked_plan(args)
    print(plan_json(plan) if args.json else render_plan(plan))
    return 0
