"""`synthwatch serve`: the dashboard, reading the same database the workers write."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

from ..cli import CliError
from ._common import add_db_arg


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve the dashboard (default http://127.0.0.1:8000)")
    add_db_arg(p)
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1; others need --auth-token)")
    p.add_argument("--port", type=int, default=None,
                   help='port to listen on (default 8000, or $SYNTHWATCH_PORT; 0: a free one)')
    p.add_argument("--auth-token", default=None,
                   help="require this token on every page and API call (or set SYNTHWATCH_AUTH_TOKEN)")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback address without a token (anyone who can reach it controls runs)")
    p.set_defaults(func=handle)


def build_settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from ..app.security import is_loopback
    from ..settings import get_settings

    base = get_settings()
    updates = {k: v for k, v in {"db": args.db, "host": args.host, "port": args.port,
                                 "auth_token": args.auth_token}.items() if v is not None}
    settings = base.model_copy(update=updates)
    if not is_loopback(settings.host) and not settings.auth_token:
        if not args.insecure:
            raise CliError(
                f"refusing to serve on {settings.host} without --auth-token: anyone who can reach it could stop "
                "your runs. Pass --auth-token TOKEN (or --insecure to accept the risk)."
            )
        print(f"WARNING: serving on {settings.host} with no authentication (--insecure)", file=sys.stderr)
    return settings


SERVE_GRACE_S = 10
"""How long ``serve`` lets open requests finish after SIGTERM before it cancels them and exits (docs/limits.md)."""


def handle(args: argparse.Namespace) -> int:
    import uvicorn

    from ..app.main import create_app
    from ..store.db import DatabaseError

    settings = build_settings(args)
    import socket

    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without, Nagle + delayed ACK add ~40 ms to every small response
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((settings.host, settings.port))
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        sock.close()
        raise CliError(f"cannot listen on {settings.host}:{settings.port}: {getattr(exc, 'strerror', None) or exc}"
                       " (another dashboard running? choose another --port)") from None
    # the port first, then the database: a busy port left a new, migrated database behind (#37)
    try:
        app = create_app(settings.db, settings)
    except DatabaseError as exc:
        sock.close()
        raise CliError(str(exc)) from None
    # listening before the address is printed: uvicorn starts the app (lifespan) before it listens, and a
    # browser or script that follows the printed link at once was refused meanwhile; the kernel now holds
    # early connections until the app answers them
    sock.listen(2048)
    port = sock.getsockname()[1]  # --port 0 picks a free port: print the real one
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    print(f"synthwatch dashboard on http://{host}:{port}/runs", file=sys.stderr, flush=True)
    # after SIGTERM or Ctrl-C, requests still running get SERVE_GRACE_S, then uvicorn cancels them and exits (#34);
    # without a bound it waited for every open request, however long (a download, a long poll)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=SERVE_GRACE_S))
    # the CLI's links (synthwatch run, watch, alarms) find this dashboard through the database while it runs
    link_host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(settings.host, host)
    with contextlib.ExitStack() as stack:
        stack.enter_context(announced(settings.db, f"http://{link_host}:{port}"))
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled
            server.run(sockets=[sock])
    return 0


@contextlib.contextmanager
def announced(db: str | None, url: str) -> Iterator[None]:
    """Record the dashboard's address in the database while it serves (store.dashboards)."""
    from ..store.dashboards import forget_dashboard, record_dashboard
    from ..store.db import open_engine

    engine = open_engine(db)
    row = record_dashboard(engine, url)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # the database gone at exit: nothing to tidy
            forget_dashboard(engine, row)
        engine.dispose()
