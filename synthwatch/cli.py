"""The `synthwatch` command. Each subcommand lives in a small module with `register(subparsers)`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
from typing import NoReturn

# (module, help) — modules are imported for their register() only; heavy imports stay inside handlers
COMMANDS = (
    "synthwatch.commands.run",
    "synthwatch.commands.simulate",
    "synthwatch.commands.serve",
    "synthwatch.commands.demo",
    "synthwatch.commands.export",
    "synthwatch.commands.probe",
    "synthwatch.commands.watch",
    "synthwatch.commands.streams",
    "synthwatch.commands.control",
    "synthwatch.commands.checks",
    "synthwatch.commands.judge",
    "synthwatch.commands.repair",
    "synthwatch.commands.db",
)


class CliError(Exception):
    """A user-facing error: printed without a traceback, exit code 2."""


def _command_module(argv: list[str] | None) -> str | None:
    """The module of the command ``argv`` names, when that module registers nothing else: only it is then imported.
    Registering all commands imports what they need to describe their flags (the simulator's settings, pydantic
    models): 0.2 CPU-s that a `synthwatch run` would spend before its first request (#25). None: build them all."""
    words = sys.argv[1:] if argv is None else argv
    name = next((w for w in words if not w.startswith("-")), None)
    if name is None:
        return None
    module = f"synthwatch.commands.{name}"
    return module if module in COMMANDS and module not in _SEVERAL_NAMES else None


# command modules whose register() adds more than the command named after the module (repair: fix, rerun, ...)
# (streams: its one command is watch-streams, not its module's name)
_SEVERAL_NAMES = frozenset({"synthwatch.commands.repair", "synthwatch.commands.watch", "synthwatch.commands.streams"})


class OneLineParser(argparse.ArgumentParser):
    """A mistake in the arguments is one line and exit code 2 (#37): `synthwatch run: error: argument --cap: must
    be at least 1, got -1`, not the whole usage (28 lines for `run`) above it; --help shows the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def build_parser(argv: list[str] | None = None, *, everything: bool = True) -> argparse.ArgumentParser:
    """The CLI's parser; with ``everything=False``, only the command ``argv`` names (if one module holds it alone)."""
    from importlib.metadata import PackageNotFoundError, version

    parser = OneLineParser(
        prog="synthwatch",
        description="Generate synthetic LLM training data from OpenAI-compatible endpoints and watch it live.",
    )
    try:
        own = version("synthwatch")
    except PackageNotFoundError:  # a checkout run without an install
        own = "unknown"
    parser.add_argument("--version", action="version", version=f"synthwatch {own}", help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    only = None if everything else _command_module(argv)
    for name in COMMANDS if only is None else (only,):
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a command not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None, *, program: bool = False) -> int:
    """Run one command. ``program``: this is the `synthwatch` process itself (entry()), not main() called from
    Python (tests, scripts): a command may then change process-wide state for good (a signal left ignored, a
    hard exit when stopping overruns its deadline). Handlers read it as ``args.program``."""
    parser = build_parser(argv, everything=False)
    args = parser.parse_args(argv)
    args.program = program
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("alembic", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from .redact import install_log_redaction

    install_log_redaction()  # bearer tokens out of every log line; keys are added as the worker reads them
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"synthwatch {args.command}: error: {exc}", file=sys.stderr)  # noqa: T201  (the CLI speaks)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C before the command installed its own handling (or one that has none)
        print(f"synthwatch {args.command}: interrupted (Ctrl-C)", file=sys.stderr)  # noqa: T201
        return 130
    except Exception as exc:  # the last resort: no traceback reaches a user (-v shows it)
        if args.verbose:
            raise
        print(f"synthwatch {args.command}: error: {type(exc).__name__}: {one_line(str(exc))} "  # noqa: T201
              "(a bug: -v shows where)", file=sys.stderr)
        return 1


def one_line(message: str) -> str:
    """A driver's message spread over lines (psycopg's "Is the server running…?") as one line."""
    return " ".join(ln.strip() for ln in message.splitlines() if ln.strip())


def entry() -> None:
    """The `synthwatch` program (console script and ``python -m synthwatch``): main(), then exit with its code.

    The command is over when main() returns, but the interpreter still has to finish (threads, modules). A Ctrl-C
    landing then, typically the second of a double press during a graceful stop, would kill the process by SIGINT
    and hide the command's exit code."""
    code = main(program=True)
    # Blocked rather than handled: finishing the interpreter resets Python's signal handlers to the default, which
    # for SIGINT kills the process. A blocked signal stays pending and is dropped when the process exits.
    with contextlib.suppress(ValueError, OSError, AttributeError):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    sys.exit(code)

if __name__ == "__main__":
    entry()
