"""`synthwatch run`: load a dataset into a run (or resume it) and generate."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

from ..capture.reasoning import MODES as REASONING_MODES
from ..cli import CliError
from ..config import DatasetConfig
from ..sources.load import RunLoadError, default_name, prepare_run
from ._common import (
    add_db_arg,
    add_option_flags,
    dashboard_hint,
    json_object_flag,
    option_values,
    positive_float,
    positive_int,
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="generate: send a dataset's prompts to endpoints and store every result",
        description="Settings come from --config (TOML, same keys as docs/configuration.md) and flags; "
        "flags win. A run whose name exists is resumed: nothing is loaded twice or redone.",
    )
    add_db_arg(p)
    p.add_argument("--config", help="TOML file with the run settings")
    p.add_argument("--name", help="run name (default: <dataset>-<model>-<time>); an existing name resumes")
    p.add_argument("--join", metavar="RUN", help="add this worker to a run in progress (shares its queue)")
    p.add_argument("--new-config-version", action="store_true",
                   help="resuming with settings that differ from the run's: make them a new config version "
                   "(without it such a resume is refused, listing the differences)")
    p.add_argument("--reason", help="with --new-config-version: why (kept with the version)")
    add_option_flags(p.add_argument_group("dataset"), DatasetConfig)
    g = p.add_argument_group("endpoints and requests")
    g.add_argument("--base-url", action="append", help="OpenAI-compatible base URL; repeat for several")
    g.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    g.add_argument("--model")
    g.add_argument("--no-stream", dest="stream", action="store_false", default=None)
    g.add_argument("--concurrency", type=concurrency_arg, metavar="N|auto",
                   help="requests in flight; 'auto' tunes it to the servers (autotune in docs/configuration.md)")
    g.add_argument("--concurrency-min", type=positive_int, help="with --concurrency auto: the fewest in flight")
    g.add_argument("--concurrency-max", type=positive_int, help="with --concurrency auto: the most in flight")
    g.add_argument("--cap", type=positive_int, help="stop once this many records are ok")
    g.add_argument("--max-tokens", type=positive_int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-p", type=float)
    g.add_argument("--seed", type=int, help="sampling seed sent with each request")
    g.add_argument("--stop", action="append", help="stop string; repeat for several")
    g.add_argument("--extra-body", help='JSON merged into each request, e.g. \'{"chat_template_kwargs": {...}}\'')
    g.add_argument("--turns", choices=["last", "all"],
                   help="multi-turn conversations: generate only the final answer (last, the default) or every "
                   "assistant turn in order, each request carrying the model's own earlier answers (all)")
    g.add_argument("--history-reasoning", choices=["strip", "keep"],
                   help="--turns all: leave the model's earlier reasoning out of later requests (strip, the "
                   "default) or send it back as reasoning_content (keep)")
    g.add_argument("--return-token-ids", action="store_true", default=None,
                   help="ask the server (vLLM) for the exact prompt and completion token ids")
    g = p.add_argument_group("timeouts and retries")
    g.add_argument("--connect-timeout-s", type=positive_float)
    g.add_argument("--timeout-s", type=positive_float, help="total time for one request")
    g.add_argument("--idle-timeout-s", type=positive_float, help="longest silence between stream chunks")
    g.add_argument("--max-attempts", type=positive_int)
    g.add_argument("--shutdown-grace-s", type=float, metavar="S",
                   help="after the first SIGTERM or SIGINT, how long in-flight requests may take to finish before they"
                   " are interrupted and their records go back to pending (default 10; a second signal stops at once)")
    g = p.add_argument_group("reasoning and tokenizer")
    g.add_argument("--reasoning-mode", choices=REASONING_MODES)
    g.add_argument("--no-expect-reasoning", dest="expect_reasoning", action="store_false", default=None)
    g.add_argument("--prefilled-think", action="store_true", default=None,
                   help="the chat template already opens the think block in the prompt")
    g.add_argument("--tokenizer", help="tokenizer folder or cached name ('deepseek-v4' is shipped)")
    g.add_argument("--chat-template", help="chat template file (.jinja) or 'deepseek-v4'")
    g.add_argument("--trust-remote-code", action="store_true", default=None)
    g = p.add_argument_group("output")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g.add_argument("--log-json", action="store_true", help="progress as JSON lines on stdout (non-interactive)")
    g.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve this worker's own Prometheus metrics on 127.0.0.1:PORT (0: any free port; docs/metrics.md)")
    p.set_defaults(func=handle)


def concurrency_arg(value: str) -> int | str:
    return "auto" if value.strip().lower() == "auto" else positive_int(value)


def _flags_to_config(a: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user gave, shaped like the TOML file."""
    cfg: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if value is None:
            return
        node = cfg
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    put("name", a.name)
    for key, value in option_values(a, DatasetConfig).items():
        put(f"dataset.{key}", value)
    if a.base_url:
        cfg["endpoints"] = [{"base_url": u, **({"api_key_env": a.api_key_env} if a.api_key_env else {})}
                            for u in a.base_url]
    elif a.api_key_env:
        cfg["_api_key_env"] = a.api_key_env
    put("model", a.model)
    put("stream", a.stream)
    if a.concurrency == "auto":
        put("autotune.enabled", True)
    else:
        put("concurrency", a.concurrency)
    put("autotune.min", a.concurrency_min)
    put("autotune.max", a.concurrency_max)
    put("cap", a.cap)
    put("sampling.max_tokens", a.max_tokens)
    put("sampling.temperature", a.temperature)
    put("sampling.top_p", a.top_p)
    put("sampling.seed", a.seed)
    put("sampling.stop", a.stop)
    if a.extra_body:
        put("sampling.extra_body", json_object_flag(a.extra_body, "--extra-body"))
    put("request_token_ids", a.return_token_ids)
    put("turns", a.turns)
    put("history_reasoning", a.history_reasoning)
    put("timeouts.connect_s", a.connect_timeout_s)
    put("timeouts.total_s", a.timeout_s)
    put("timeouts.idle_s", a.idle_timeout_s)
    put("retries.max_attempts", a.max_attempts)
    put("shutdown_grace_s", a.shutdown_grace_s)
    put("reasoning.mode", a.reasoning_mode)
    put("reasoning.expect", a.expect_reasoning)
    put("reasoning.prefilled_open", a.prefilled_think)
    put("tokenizer.name_or_path", a.tokenizer)
    put("tokenizer.chat_template", a.chat_template)
    put("tokenizer.trust_remote_code", a.trust_remote_code)
    return cfg


def resolve_config(a: argparse.Namespace, stored: dict[str, Any] | None = None) -> Any:
    from ..config import ConfigError, build_config, deep_merge, load_toml

    base: dict[str, Any] = dict(stored or {})
    source = "command line"
    if a.config:
        try:
            base = deep_merge(base, load_toml(a.config))
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        source = f"{a.config} + command line"
    flags = _flags_to_config(a)
    key_env = flags.pop("_api_key_env", None)
    merged = deep_merge(base, flags)
    if key_env and merged.get("endpoints"):
        merged["endpoints"] = [{**e, "api_key_env": key_env} for e in merged["endpoints"]]
    missing = [k for k in ("dataset", "endpoints", "model") if k not in merged]
    if missing:
        flag = {"dataset": "--dataset", "endpoints": "--base-url", "model": "--model"}
        raise CliError("missing " + ", ".join(f"{k} ({flag[k]} or in --config)" for k in missing))
    try:
        return build_config(merged, source)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


class Progress:
    """The live progress line (stderr, rewritten in place) or JSON lines (stdout)."""

    def __init__(self, name: str, *, json_lines: bool, quiet: bool) -> None:
        self.name = name
        self.json_lines = json_lines
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last_json = 0.0

    def tick(self, w: Any) -> None:
        if self.quiet and not self.json_lines:
            return
        ctl = w.writer.control if w.writer else {}
        s = w.stats
        rps, tps = s.rates()
        n_ok = ctl.get("n_ok", 0) or 0
        cap = ctl.get("cap")
        target = cap if cap is not None else (n_ok + (ctl.get("n_pending") or 0) + (ctl.get("n_in_flight") or 0))
        finished = s.ok + s.errors + s.timeouts
        eta_s = (target - n_ok) / rps if rps > 0 and target > n_ok else None
        info = {
            "run": self.name, "state": w.state, "ok": n_ok, "cap": cap, "target": target,
            "req_per_s": round(rps, 2), "out_tok_per_s": round(tps, 1), "in_flight": len(w.tasks),
            "concurrency": ctl.get("concurrency"), "errors": s.errors, "timeouts": s.timeouts, "retries": s.retries,
            "timeout_share": round(s.timeouts / finished, 4) if finished else 0.0,
            "empty_reasoning_share": round(s.empty_reasoning / s.ok, 4) if s.ok else 0.0,
            "eta_s": round(eta_s) if eta_s is not None else None,
            "db_error": w.writer.error if w.writer else None,
        }
        if self.json_lines:
            print(json.dumps(info), flush=True)
            return
        eta = _fmt_duration(eta_s) if eta_s is not None else "–"
        line = (
            f"{self.name} [{w.state}] ok {n_ok}/{target} | {rps:.1f} req/s | {tps:,.0f} tok/s | "
            f"in flight {len(w.tasks)}/{ctl.get('concurrency')} | errors {s.errors} | "
            f"timeouts {s.timeouts} ({info['timeout_share']:.1%}) | empty reasoning "
            f"{info['empty_reasoning_share']:.1%} | ETA {eta}"
        )
        if info["db_error"]:
            line += f" | DATABASE: {info['db_error']}"
        if self.tty:
            print("\r\x1b[2K" + line, end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self._last_json >= 10:
            self._last_json = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and not self.quiet and not self.json_lines:
            print(file=sys.stderr)


def _fmt_duration(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _resume_settings(engine: Any, a: argparse.Namespace, run: dict[str, Any], config: Any) -> None:
    """A resume never changes settings silently: differences are refused, or become a new config version."""
    from ..store.versions import create_version, refusal, resume_check

    stored = json.loads(run["config_json"])
    changes = resume_check(stored, config)
    if changes and not a.new_config_version:
        raise CliError(refusal(run["name"], changes))
    if changes:
        from ..store.queue import write_begin

        with engine.connect() as conn, write_begin(conn):
            snap = config.snapshot()
            # cap and concurrency are controls: the version keeps what the run was created with
            for key in ("cap", "concurrency"):
                snap[key] = stored.get(key, snap[key])
            version, _ = create_version(conn, run["id"], snap, actor="cli", reason=a.reason)
        print(f"run {run['name']!r}: config version {version} ("
              + "; ".join(c.describe() for c in changes) + ")", file=sys.stderr)
    # cap and concurrency: a flag sets them (a control, in the audit log); without one the run keeps its own
    flags = _flags_to_config(a)
    if "cap" not in flags:
        config.cap = run["cap"]
    if "concurrency" not in flags and run["concurrency"]:
        config.concurrency = run["concurrency"]


def handle(a: argparse.Namespace) -> int:
    from ..store.db import DatabaseError, open_engine, safe_url
    from ..store.queue import NotFound, run_row
    from ..workers.endpoints import MissingApiKey
    from ..workers.engine import EXIT_CODES, RunWorker

    try:
        engine = open_engine(a.db)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    existing = None
    ref = a.join or a.name
    if ref:
        try:
            with engine.connect() as conn:
                existing = run_row(conn, ref)
        except NotFound as exc:
            if a.join:
                raise CliError(str(exc)) from None
    if existing is not None:
        if existing["kind"] != "generate":
            raise CliError(f"run {existing['name']!r} is a {existing['kind']} run (synthwatch {existing['kind']});"
                           " choose another --name")
        # resume (or join): the run's current config version, with what the flags and --config file change
        config = resolve_config(a, json.loads(existing["config_json"]))
        config.name = existing["name"]
        run_id, resumed = existing["id"], True
        _resume_settings(engine, a, existing, config)
    else:
        config = resolve_config(a)
        if not config.name:
            config.name = default_name(config)
        try:
            run_id, resumed = prepare_run(engine, config)
        except RunLoadError as exc:
            raise CliError(str(exc)) from None
    out = sys.stderr
    verb = "joining" if a.join else ("resuming" if resumed else "starting")
    print(f"{verb} run {config.name!r} (id {run_id}) in {safe_url(str(engine.url))}", file=out)
    print(f"dashboard: {dashboard_hint(a.db)}  then open http://127.0.0.1:8000/runs/{run_id}", file=out)
    progress = Progress(config.name, json_lines=a.log_json, quiet=a.quiet)
    from ..quality.checks import ChecksConfigError
    from ..quality.live import writer_hooks

    try:
        hooks = writer_hooks(engine, run_id, config)
    except ChecksConfigError as exc:
        raise CliError(str(exc)) from None
    try:
        # hard_exit: in the `synthwatch` program a stop that overruns its deadline ends the process (workers/supervisor.py)
        worker = RunWorker(engine, run_id, config, join=bool(a.join), hooks=hooks, on_tick=progress.tick,
                           hard_exit=a.program)
    except MissingApiKey as exc:
        raise CliError(str(exc)) from None

    if a.metrics_port is not None:
        from ..workers.worker_metrics import serve as serve_metrics

        try:
            port = serve_metrics(worker, a.metrics_port)
        except OSError as exc:
            raise CliError(f"--metrics-port {a.metrics_port}: cannot listen ({exc})") from None
        print(f"worker metrics: http://127.0.0.1:{port}/metrics", file=out)

    async def go() -> str:
        worker.install_signal_handlers()
        return await worker.main()

    final = asyncio.run(go())
    # The run is over (its state is stored): a Ctrl-C from here on, the second of a double press landing as the
    # worker finished, has nothing left to stop and must not turn the outcome into an interrupt.
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        progress.close()
        with engine.connect() as conn:
            row = run_row(conn, run_id)
        message = row.get("status_message") or ""
        head = final
        if final == "completed" and message.startswith("completed with "):
            head, _, rest = message.partition(" (")
            message = rest.rstrip(")")
        print(
            f"run {config.name!r} {head}: {row['n_ok']} ok, {row['n_error']} errors, {row['n_timeout']} timeouts, "
            f"{row['n_pending']} pending" + (f" — {message}" if message else ""),
            file=out,
        )
        return EXIT_CODES.get(final, 1)
    finally:
        if main_thread and not a.program:  # the program keeps ignoring it until entry() takes over
            signal.signal(signal.SIGINT, previous)
