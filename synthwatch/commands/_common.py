"""Options and helpers shared by subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import BaseModel

from ..config import option_kind, options


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        default=None,
        help="SQLite file or SQLAlchemy URL (default: $SYNTHWATCH_DB or synthwatch.db)",
    )


OLD_FLAGS: dict[str, str] = {}
"""An old flag name -> its new name (the TOML key's path with hyphens), for every command (add_flag)."""
_said: set[str] = set()  # old names whose new name was printed (once per process)


class OldFlagName(argparse.Action):
    """An old name of a flag: it still works, sets what the new name sets, and prints the new name once."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kw: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string and option_string not in _said:
            _said.add(option_string)
            print(f"note: {option_string} is now {self.new} (named after its TOML key); the old name still works",
                  file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_flag(group: Any, flag: str, *old: str, **kw: Any) -> argparse.Action:
    """``flag`` (named after the TOML key it sets: its path with hyphens) and its ``old`` names, hidden from
    --help, which keep working and print the new name once."""
    action = group.add_argument(flag, **kw)
    kind = kw.get("action")
    extra: dict[str, Any] = {k: kw[k] for k in ("type", "choices", "metavar") if k in kw}
    if kind in ("store_true", "store_false"):
        extra = {"nargs": 0, "const": kind == "store_true"}
    for name in old:
        OLD_FLAGS[name] = flag
        group.add_argument(name, dest=action.dest, action=OldFlagName, new=flag, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS, **extra)
    return action


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {x}")
    return x


def dashboard_hint(db: str | None) -> str:
    from ..hints import command

    return command("serve", db=db)


def open_run(db: str | None, ref: str) -> tuple[Any, dict[str, Any]]:
    """(engine, run row) for a run name or id; a missing database or run is a CliError naming it."""
    from ..cli import CliError
    from ..store.db import DatabaseError, open_engine
    from ..store.queue import NotFound, run_row

    try:
        engine = open_engine(db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    try:
        with engine.connect() as conn:
            run = run_row(conn, ref)
    except NotFound as exc:
        raise CliError(str(exc)) from None
    return engine, run


def json_object_flag(value: str, flag: str) -> dict[str, Any]:
    """A flag whose value must be a JSON object (e.g. --extra-body); anything else is a CliError naming the flag."""
    from ..cli import CliError

    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise CliError(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CliError(f"{flag} must be a JSON object")
    return obj


def add_option_flags(group: Any, model: type[BaseModel]) -> None:
    """A flag for every field of the model declared with an Option (synthwatch.config), typed from the field:
    choices from a Literal, a switch for a bool, a whole number (at least 1 when the field says ge=1)."""
    for name, info, opt in options(model):
        dest = f"opt_{model.__name__}_{name}"
        help_ = opt.flag_help or (info.description or "").rstrip(".")
        metavar = name.upper()
        if opt.flag_value is not None:
            group.add_argument(opt.flag, dest=dest, action="store_const", const=opt.flag_value, help=help_)
            continue
        kind, choices, at_least_1 = option_kind(info)
        if kind == "bool":
            group.add_argument(opt.flag, dest=dest, action="store_true", default=None, help=help_)
        elif kind == "choice":
            group.add_argument(opt.flag, dest=dest, choices=choices, help=help_)
        elif kind == "int":
            group.add_argument(opt.flag, dest=dest, type=positive_int if at_least_1 else int, metavar=metavar,
                               help=help_)
        else:
            group.add_argument(opt.flag, dest=dest, metavar=metavar, help=help_)


def option_values(a: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields the user gave as flags (add_option_flags)."""
    out = {}
    for name, _info, _opt in options(model):
        value = getattr(a, f"opt_{model.__name__}_{name}", None)
        if value is not None:
            out[name] = value
    return out
