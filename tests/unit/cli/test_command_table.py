"""recipeforge/cli/app.py: the command table is the command line. Every command it names has a parser of that
name, in the table's order (the order --help lists them), run by a function of the module that adds it."""

from __future__ import annotations

import argparse

from recipeforge.cli.app import COMMANDS, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_parser_holds_the_table_in_its_order():
    assert list(_subparsers(build_parser())) == [name for name, _ in COMMANDS]


def test_each_command_runs_in_the_module_that_adds_it():
    parsers = _subparsers(build_parser())
    for name, add in COMMANDS:
        run = parsers[name].get_default("func")
        assert callable(run), name
        assert run.__module__ == add.__module__, f"{name}: added in {add.__module__}, run by {run.__module__}"


def test_the_table_names_each_command_once():
    names = [name for name, _ in COMMANDS]
    assert len(names) == len(set(names))
