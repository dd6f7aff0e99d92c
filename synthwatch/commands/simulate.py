"""`synthwatch simulate`: an OpenAI-compatible server shaped like vLLM >= 0.16, for tests and demos."""

from __future__ import annotations

import argparse

from ..cli import CliError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from ..simulator import launch as simulator

    p = sub.add_parser("simulate", help="serve a simulated vLLM-shaped endpoint (/v1/chat/completions)",
                       description="Serves until Ctrl-C (exit code 0). A port that is taken: exit code 2.")
    p.add_argument("--host", default="127.0.0.1", help='address to listen on (default 127.0.0.1)')
    p.add_argument("--port", type=int, default=8001, help='port to listen on (default 8001)')
    simulator.add_arguments(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import socket

    from ..simulator import launch as simulator

    config = simulator.config_from_args(args)
    # the port is tried before the server starts, so that a busy one is one line (it was an OSError traceback)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((args.host, args.port))
        except (OSError, OverflowError) as exc:
            raise CliError(f"cannot listen on {args.host}:{args.port}: {getattr(exc, 'strerror', None) or exc} "
                           "(another server running there? choose another --port)") from None
    try:
        simulator.run(config, args.host, args.port)
    except OSError as exc:  # taken between the check and the start
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0
