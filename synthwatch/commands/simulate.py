"""`synthwatch simulate`: an OpenAI-compatible server shaped like vLLM >= 0.16, for tests and demos."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from ..simulator import launch as simulator

    p = sub.add_parser("simulate", help="serve a simulated vLLM-shaped endpoint (/v1/chat/completions)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    simulator.add_arguments(p)
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..simulator import launch as simulator

    simulator.run(simulator.config_from_args(args), args.host, args.port)
    return 0
