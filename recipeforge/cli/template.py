"""The command check-template: does the chat template a recipe trains with give the model the same
tokens as the server that will run it (`components.template_check`)?"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from recipeforge.cli.common import load, recipe_args

if TYPE_CHECKING:
    from recipeforge.cli.common import Subparsers


def add_check_template(sub: Subparsers) -> None:
    p = sub.add_parser("check-template",
                       help="check that training and serving give the model the same tokens for a conversation "
                            "(names the first differing token)")
    recipe_args(p)
    p.add_argument("--serve", metavar="DIR|TEMPLATE",
                   help="the serving side: a model or tokenizer directory a server loads, a template name or a "
                        ".jinja file given to the server; default: the tokenizer as the run saves it")
    p.set_defaults(func=cmd_check_template)


def cmd_check_template(args: argparse.Namespace) -> int:
    from recipeforge.components.template_check import check_recipe_template

    loaded = load(args)
    conversations, replies = check_recipe_template(loaded.recipe, base_dir=loaded.path.parent,
                                                   locate=loaded.tree.locate, serve=args.serve)
    print(f"ok: training and serving give the same tokens before each of {replies} replies in "
          f"{conversations} probe conversations (data.chat_template: {loaded.recipe.data.chat_template})")
    return 0
