"""`synthwatch db upgrade|current`: migrations by hand (every command also migrates on open)."""

from __future__ import annotations

import argparse

from ._common import add_db_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("db", help="database maintenance (migrations run automatically on open)")
    add_db_arg(p)
    p.add_argument("action", choices=["upgrade", "current"])
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from alembic import command

    from ..cli import CliError, one_line
    from ..store.db import DatabaseError, alembic_config, migrate, resolve_url, safe_url

    url = resolve_url(args.db)
    if args.action == "upgrade":
        try:
            migrate(url)
        except DatabaseError as exc:
            raise CliError(one_line(str(exc))) from None
        print(f"{safe_url(url)}: schema at head")
    else:
        command.current(alembic_config(url))
    return 0
