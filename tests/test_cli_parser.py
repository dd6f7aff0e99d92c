"""`synthwatch COMMAND` registers only that command's module when the module holds it alone (#25: registering every
command cost a `synthwatch run` 0.2 CPU-s before its first request); the lone parser must be the full parser's."""

from __future__ import annotations

import argparse
import importlib

import pytest

from synthwatch.cli import COMMANDS, build_parser


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser) -> list[tuple[tuple[str, ...], str, object]]:
    return [(tuple(a.option_strings), a.dest, a.default) for a in p._actions]


FULL = _commands(build_parser())


@pytest.mark.parametrize("name", sorted(FULL))
def test_a_command_parsed_alone_has_the_full_parsers_flags(name: str) -> None:
    lone = _commands(build_parser([name], everything=False))
    assert name in lone and _flags(lone[name]) == _flags(FULL[name])
    module = f"synthwatch.commands.{name}"
    if len(lone) == 1:  # built alone: the module must hold exactly this command
        assert module in COMMANDS
    else:
        assert lone.keys() == FULL.keys()


def test_the_usual_commands_are_built_alone_and_the_rest_in_full() -> None:
    assert list(_commands(build_parser(["-v", "run", "--dataset", "x"], everything=False))) == ["run"]
    assert list(_commands(build_parser(["simulate"], everything=False))) == ["simulate"]
    # a module registering several commands, an unknown word, no word: everything
    for argv in (["fix"], ["watch"], ["nonsense"], ["-v"], []):
        assert _commands(build_parser(argv, everything=False)).keys() == FULL.keys(), argv


def test_each_module_built_alone_registers_exactly_its_namesake() -> None:
    """A module that registers a second command must be built in full (cli._SEVERAL_NAMES): otherwise that
    command, named first, would be refused by a parser that lacks it."""
    for module in COMMANDS:
        name = module.rsplit(".", 1)[1]
        lone = _commands(build_parser([name], everything=False))
        if len(lone) > 1:
            continue  # built in full
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        assert list(_commands(parser)) == [name], module
