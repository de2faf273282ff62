"""The command table: every command's name and the function that adds its parser, in the order --help lists
them, and the parser built from it with the global flags."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from recipeforge import __version__
from recipeforge.cli import after, evaluate, launch, mcp, planning, recipes, template, train, tune, ui, use

# (name, adds its parser to the subparsers): --help lists them in this order.
COMMANDS: tuple[tuple[str, Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]], ...] = (
    ("plugins", recipes.add_plugins),
    ("validate", recipes.add_validate),
    ("resolve", recipes.add_resolve),
    ("diff", recipes.add_diff),
    ("report", evaluate.add_report),
    ("convert", recipes.add_convert),
    ("schema", recipes.add_schema),
    ("plan", planning.add_plan),
    ("check-template", template.add_check_template),
    ("train", train.add_train),
    ("tune", tune.add_tune),
    ("launch", launch.add_launch),
    ("preprocess", train.add_preprocess),
    ("convert-checkpoint", train.add_convert_checkpoint),
    ("merge", after.add_merge),
    ("export", after.add_export),
    ("chat", use.add_chat),
    ("serve", use.add_serve),
    ("eval", evaluate.add_eval),
    ("push", after.add_push),
    ("mcp", mcp.add_mcp),
    ("ui", ui.add_ui),
)
# Flags of the program that may also stand after the command (`recipeforge eval RUN --trust-code`).
GLOBAL_FLAGS = ("--debug", "--verbose", "--trust-code")


def build_parser() -> argparse.ArgumentParser:
    """The command line: global flags, then each command's arguments (in the order --help lists them)."""
    parser = argparse.ArgumentParser(
        prog="recipeforge",
        description="Train LLMs from one declarative YAML recipe: validate it, plan the distributed "
                    "backend and memory, and run pretrain / SFT / DPO / GRPO on the Hugging Face stack.",
        epilog="Exit codes: 0 ok, 2 problem in the input (recipe, data, arguments, a run directory in use), "
               "1 internal error, 75 training stopped by SIGTERM/SIGUSR1/Ctrl-C after saving a checkpoint (run "
               "the same command again to resume), 130 aborted by a second Ctrl-C, 3 (train) the run finished and "
               "is saved but output.push_to_hub failed (`recipeforge push RUN_DIR` retries). "
               "--debug (or RECIPEFORGE_DEBUG=1) shows tracebacks.")
    parser.add_argument("--version", action="version", version=f"recipeforge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--verbose", action="store_true",
                        help="show the libraries' warnings on the console (by default a run writes them to "
                             "RUN_DIR/logs/warnings.log); same as RECIPEFORGE_VERBOSE=1")
    parser.add_argument("--trust-code", action="store_true",
                        help="allow the recipe or the command to run Python code it names: a reward by dotted "
                             "path (my_mod:f), model.trust_remote_code, lm-eval task files (.yaml); same as "
                             "allow_code: true in the recipe")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, add in COMMANDS:
        add(sub)
    return parser
