"""The commands that read recipes and plugins, and never train: plugins, validate, resolve, diff, convert and
schema. None imports torch or transformers."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from recipeforge import __version__
from recipeforge.cli.common import load, recipe_args, write_output
from recipeforge.errors import RecipeError

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_plugins(sub: Subparsers) -> None:
    p = sub.add_parser("plugins", help="list plugin components by group: name, distribution, version, status")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    from recipeforge.plugins import plugins_report, render_plugins

    print(json.dumps(plugins_report(), indent=2, default=str) if args.json else render_plugins())
    return 0


def add_validate(sub: Subparsers) -> None:
    p = sub.add_parser("validate", help="check a recipe and report every problem with its file:line")
    recipe_args(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON (recipe, stage, model, adapter)")
    p.set_defaults(func=cmd_validate)


def validation_record(args: argparse.Namespace) -> dict[str, Any]:
    """Load and check the recipe `args` names (raises `RecipeError`); what `validate --json` prints."""
    r = load(args).recipe
    return {"ok": True, "recipe": str(args.recipe), "stage": r.stage, "model": r.model.name_or_path,
            "adapter": r.adapter.type}


def cmd_validate(args: argparse.Namespace) -> int:
    record = validation_record(args)
    from recipeforge.errors import bounded_text

    print(json.dumps(record, indent=2) if args.json else
          bounded_text(f"ok: {args.recipe} is a valid {record['stage']} recipe (model {record['model']}, "
                       f"adapter {record['adapter']})"))
    return 0


def add_resolve(sub: Subparsers) -> None:
    p = sub.add_parser("resolve", help="print the fully resolved recipe (extends, overrides, ${...}, defaults)")
    recipe_args(p)
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--lock", action="store_true",
                   help="add a `lock:` section: package versions, the model's revision, dataset fingerprints "
                        "and the planned hardware (`train` warns when they differ; `train --strict` refuses)")
    p.set_defaults(func=cmd_resolve)


def cmd_resolve(args: argparse.Namespace) -> int:
    from recipeforge.config.dump import dump_recipe

    loaded = load(args)
    if not args.lock:
        write_output(dump_recipe(loaded), args.output)
        return 0
    import yaml

    from recipeforge.config.dump import resolved_data
    from recipeforge.config.lock import build_lock, plan_hardware
    from recipeforge.plan import hardware_for
    from recipeforge.plan.world import plan_for_world

    plan = plan_for_world(loaded.recipe, hardware=hardware_for(loaded.recipe, None))
    data = {**resolved_data(loaded), "lock": build_lock(loaded, plan_hardware(plan))}
    write_output(f"# Resolved and locked by recipeforge {__version__} from {loaded.path}; `recipeforge train` warns "
                 f"when this environment differs from `lock:` (--strict: refuses).\n"
                 + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100), args.output)
    return 0


def add_diff(sub: Subparsers) -> None:
    p = sub.add_parser("diff", help="the difference of two resolved recipes (recipe, run dir or lock file); "
                                    "exit 0 equal, 1 different, 2 bad input")
    p.add_argument("a", help="recipe file, lock file or run directory")
    p.add_argument("b", help="recipe file, lock file or run directory")
    p.add_argument("--json", action="store_true", help="print the differences as JSON (recipe and lock lines)")
    p.set_defaults(func=cmd_diff)


def diff_record(a: str, b: str) -> dict[str, Any]:
    """The differences of two resolved recipes, as `diff --json` prints them (raises `RecipeError`)."""
    from recipeforge.tools.recipe_diff import diff_sides

    recipe_lines, lock_lines = diff_sides(a, b)
    return {"a": a, "b": b, "equal": not (recipe_lines or lock_lines), "recipe": recipe_lines, "lock": lock_lines}


def cmd_diff(args: argparse.Namespace) -> int:
    from recipeforge.tools.recipe_diff import render_diff

    record = diff_record(args.a, args.b)
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        sys.stdout.write(render_diff(args.a, args.b, record["recipe"], record["lock"]))
    return 0 if record["equal"] else 1


def add_convert(sub: Subparsers) -> None:
    p = sub.add_parser("convert", help="convert another tool's config to a recipe (axolotl)")
    p.add_argument("tool", choices=("axolotl",), help="the tool the config is written for")
    p.add_argument("config", help="the tool's YAML config")
    p.add_argument("-o", "--output", help="write the recipe to this file instead of stdout")
    p.add_argument("--world-size", type=int, default=1,
                   help="GPUs the config was run on, for the global batch (micro x accumulation x world size; "
                        "default 1)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from recipeforge.config.axolotl import convert_file

    if args.world_size < 1:
        raise RecipeError("--world-size must be 1 or more", key="--world-size")
    result = convert_file(args.config, world_size=args.world_size)
    sys.stderr.write(result.report_text())
    write_output(result.recipe_text(), args.output)
    return 0


def add_schema(sub: Subparsers) -> None:
    p = sub.add_parser("schema", help="print the recipe's JSON Schema (or the Markdown reference)")
    p.add_argument("--format", choices=("json", "markdown"), default="json")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_schema)


def cmd_schema(args: argparse.Namespace) -> int:
    if args.format == "json":
        from recipeforge.config.jsonschema import recipe_json_schema

        text = json.dumps(recipe_json_schema(), indent=2) + "\n"
    else:
        from recipeforge.config.reference import recipe_reference_markdown

        text = recipe_reference_markdown()
    write_output(text, args.output)
    return 0
