"""`synthwatch judge`: judge a run's records with its [judge] model (those not judged yet), then print the rates."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any

from ..cli import CliError
from ._common import add_db_arg, open_run


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "judge",
        help="judge a run's ok records with its judge model (the sampled ones without a verdict yet)",
        description="Uses the run's [judge] settings, or --config's [judge] table (which then becomes a new config "
        "version of the run). A `synthwatch run` with [judge] judges as it goes; this catches up afterwards.",
    )
    add_db_arg(p)
    p.add_argument("run", help="run name or id")
    p.add_argument("--config", help="TOML file with a [judge] table (docs/checks.md)")
    p.add_argument("--retry-errors", action="store_true",
                   help="judge again only the records whose judge verdict in force is an error (the judge answered "
                        "prose or bad JSON, failed or hung); the error stays in the history")
    p.add_argument("--max-s", type=float, default=3600, help="stop after this many seconds (default 3600)")
    p.set_defaults(func=handle)


def handle(a: argparse.Namespace) -> int:
    from ..config import ConfigError, JudgeConfig, load_toml
    from ..quality.detection import overrides  # noqa: F401  - registers the guard a new config version passes (#35)
    from ..store.versions import VersionError, create_version
    from ..workers.endpoints import MissingApiKey
    from ..workers.judge import JudgeRunner, unkept_fields

    engine, run = open_run(a.db, a.run)
    stored = json.loads(run["config_json"] or "{}")
    raw = stored.get("judge")
    if a.config:
        try:
            raw = load_toml(a.config).get("judge")
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        if raw is None:
            raise CliError(f"{a.config}: no [judge] table")
    if not raw:
        raise CliError(f"run {run['name']!r} has no [judge] settings: give --config FILE with a [judge] table")
    if not a.config:  # the stored judge: re-checked if a dashboard change set it (#34)
        from .run import refuse_dashboard_changes

        refuse_dashboard_changes(engine, run, stored)
    try:
        cfg = JudgeConfig.model_validate(raw)
    except Exception as exc:  # noqa: BLE001 - pydantic's message, said as a CLI error
        raise CliError(f"[judge]: {exc}") from None
    if (why := unkept_fields(engine, int(run["id"]), cfg)) is not None:
        raise CliError(why)
    if a.config and cfg.model_dump(mode="json") != stored.get("judge"):
        from ..store.queue import write_begin

        try:
            with engine.connect() as conn, write_begin(conn):
                version, _ = create_version(conn, run["id"], {**stored, "judge": cfg.model_dump(mode="json")},
                                            actor="cli", reason="synthwatch judge --config")
        except VersionError as exc:
            raise CliError(str(exc)) from None
        print(f"run {run['name']!r}: config version {version} (judge settings)", file=sys.stderr)
    try:
        runner = JudgeRunner(engine, int(run["id"]), cfg, run_name=run["name"], retry_errors=a.retry_errors)
    except MissingApiKey as exc:
        raise CliError(f"judge: {exc}") from None
    stop = threading.Event()
    stop.set()  # judge what is there, then stop
    t0 = time.monotonic()
    n = asyncio.run(runner.run(stop, drain_deadline=[t0 + a.max_s]))
    with engine.connect() as conn:
        from sqlalchemy import text

        u: Any = conn.execute(text("SELECT requests, n_pass, n_fail, n_error, prompt_tokens, completion_tokens"
                                   " FROM judge_usage WHERE run_id = :r"), {"r": run["id"]}).first()
    if a.retry_errors:
        with engine.connect() as conn:
            from ..quality.extended import errored_ids

            left = len(errored_ids(conn, int(run["id"]), "judge"))
            conn.rollback()
        print(f"judge {cfg.model}: retried {len(runner.retried)} error verdicts; {left} still error")
    print(f"judge {cfg.model}: {n} verdicts in {time.monotonic() - t0:.1f} s"
          + (f"; in all {u[1]} good, {u[2]} bad, {u[3]} errors; {u[0]} requests, {u[4]:,} prompt and {u[5]:,}"
             " completion tokens (apart from the run's)" if u else ""))
    return 0

