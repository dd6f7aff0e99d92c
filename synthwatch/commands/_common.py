"""Options and helpers shared by subcommands."""

from __future__ import annotations

import argparse
import os


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        default=None,
        help="SQLite file or SQLAlchemy URL (default: $SYNTHWATCH_DB or synthwatch.db)",
    )


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
    where = f" --db {db}" if db else (" --db $SYNTHWATCH_DB" if os.environ.get("SYNTHWATCH_DB") else "")
    return f"synthwatch serve{where}"
