"""`synthwatch demo`: two simulated vLLM servers, two worker processes and the dashboard, in one command.

Run A ("healthy") reads reasoning from wherever the server puts it (mode auto) against a server
shaped like vLLM >= 0.16 with a few rate limits and stalls, so the charts have something to show.
Run B ("drift") expects the older ``reasoning_content`` field; its server starts out sending both
fields (vLLM 0.11-0.15) and, after ``--drift-after-s``, is "upgraded" to send only ``reasoning``:
from then on every record of run B has empty reasoning while its throughput looks perfectly
healthy. That is the silent corruption the dashboard exists to catch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import outbound
from ..cli import CliError
from ..hints import command as hint
from ..outbound import OutboundError, fetch, run_sync, session
from ._common import positive_float, positive_int

DEMO_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "demo_prompts.jsonl"
TOKENIZER = {"name_or_path": "deepseek-v4", "chat_template": "deepseek-v4"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo", help="start simulated endpoints, two runs and the dashboard; prints the URL",
        description="Everything runs locally (no network). Ctrl-C stops the workers, the simulators and the "
        "dashboard; the database stays in --dir for a later `synthwatch serve --db DIR/demo.db`.",
    )
    p.add_argument("--dir", default="synthwatch-demo", help="folder for the demo database, configs and logs "
                   "(default ./synthwatch-demo)")
    p.add_argument("--port", type=int, default=8000,
                   help="dashboard port on 127.0.0.1 (default 8000; a free port is used when it is busy; 0 = any)")
    p.add_argument("--concurrency", type=positive_int, default=8, help="concurrency of each demo run (default 8)")
    p.add_argument("--tokens-per-s", type=positive_float, default=30.0,
                   help="simulated decode speed of each stream (default 30)")
    p.add_argument("--drift-after-s", type=float, default=4.0,
                   help="seconds from the printed URL until run B's server stops sending reasoning_content "
                   "(default 4: the alarm shows within seconds; 0 = at once)")
    p.add_argument("--duration-s", type=positive_float, default=None,
                   help="exit by itself after this many seconds (default: until Ctrl-C)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="do not configure the shipped DeepSeek tokenizer on the demo runs")
    p.set_defaults(func=handle)


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the dashboard's socket: the asked port, or any free one when it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: without, Nagle + delayed ACK add ~40 ms to every small response
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        if port == 0:
            raise
        print(f"port {port} is busy; using a free port instead", file=sys.stderr)
        sock.bind((host, 0))
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def run_configs(base_a: str, base_b: str, *, stamp: str, concurrency: int, tokenizer: bool) -> list[dict[str, Any]]:
    common: dict[str, Any] = {
        "dataset": {"path": str(DEMO_PROMPTS)},
        "model": "sim-reasoner",
        "concurrency": concurrency,
        "sampling": {"temperature": 0.6, "max_tokens": 4096},
        "timeouts": {"connect_s": 5.0, "total_s": 120.0, "idle_s": 4.0},
        "retries": {"max_attempts": 2, "backoff_base_s": 0.5, "backoff_max_s": 4.0},
        "flush_interval_ms": 200,
    }
    if tokenizer:
        common["tokenizer"] = dict(TOKENIZER)
    return [
        {**common, "name": f"demo-healthy-{stamp}", "endpoints": [{"base_url": base_a, "name": "vllm-a"}],
         "reasoning": {"mode": "auto"}},
        {**common, "name": f"demo-drift-{stamp}", "endpoints": [{"base_url": base_b, "name": "vllm-b"}],
         "reasoning": {"mode": "reasoning_content"}},
    ]


HEALTHY_FAULTS: dict[str, Any] = {"rate_429": 0.03, "retry_after_s": 1, "rate_stall": 0.04, "stall_s": 6.0,
                                   "rate_drop": 0.01}
"""Run A's rate limits and stalls, so the charts have something to show: switched on only once the run has
finished the timeout and error alarms' first window of records (#37: one timeout among the first 20 records is 5 %,
and the "healthy" run ended red)."""


def healthy_sim(tokens_per_s: float) -> Any:
    """Run A's simulator as it starts: no fault at all (HEALTHY_FAULTS come later, faults_after_window)."""
    from ..simulator.config import SimConfig

    return SimConfig(reasoning_field="reasoning", tokens_per_s=tokens_per_s, ttft_ms=400, reasoning_tokens="40-160",
                     content_tokens="20-80", seed=1, token_ids="deepseek")


def fault_free_records() -> int:
    """Records run A finishes before its server adds faults: the timeout and error alarms' window."""
    from ..check_catalog import DEFAULT_RULES

    return max(DEFAULT_RULES["timeout"].window, DEFAULT_RULES["error"].window)


def faults_after_window(engine: Any, run_id: int | None, sim_url: str, poll_s: float = 1.0,
                        stop: threading.Event | None = None) -> bool:
    """Switch run A's faults on once it has finished fault_free_records() records (False: it never did)."""
    from sqlalchemy import text

    if run_id is None:
        return False
    need = fault_free_records()
    while not (stop and stop.is_set()):
        try:
            with engine.connect() as conn:
                row = conn.execute(text("SELECT n_ok + n_error + n_timeout, status FROM run WHERE id = :r"),
                                   {"r": run_id}).first()
        except Exception:  # noqa: BLE001 - the demo is shutting down; nothing to switch on
            return False
        if row is None or row[1] not in ("created", "running", "paused", "stopping"):
            return False
        if int(row[0] or 0) >= need:
            with contextlib.suppress(OSError):
                patch_sim(sim_url, HEALTHY_FAULTS)
                print(f"[demo] run A's server now adds a few rate limits and stalls ({need} records in: past the"
                      " timeout and error alarms' first window)", flush=True)
                return True
            return False
        time.sleep(poll_s)
    return False


def patch_sim(base_url: str, changes: dict[str, Any]) -> None:
    """PATCH our own simulator's settings (through the outbound client, like every request synthwatch sends)."""
    import json

    async def go() -> None:
        async with session("demo") as sess:
            r = await fetch(sess, "PATCH", base_url.rstrip("/") + "/sim/config", cap=64 * 1024, deadline_s=5.0,
                            body=json.dumps(changes).encode(), headers={"Content-Type": "application/json"})
        if r.status >= 300:
            raise OutboundError("http", f"the simulator answered HTTP {r.status}: {r.quoted(200)}")

    run_sync(go())


@outbound.register("demo", "the demo's calls to its own simulator (commands/demo.py patch_sim)", 6.0)
def _drive_demo(base_url: str, key_env: str) -> str:
    try:
        patch_sim(base_url, {"reasoning_field": "reasoning"})
    except OutboundError as exc:
        return exc.message
    return "patched"


def handle(args: argparse.Namespace) -> int:
    import uvicorn

    from ..app import launch
    from ..app.main import create_app
    from ..config import ConfigError, build_config
    from ..settings import get_settings
    from ..simulator.config import SimConfig
    from ..simulator.launch import running_in_thread
    from ..store.db import DatabaseError, open_engine, resolve_url

    if not DEMO_PROMPTS.exists():
        raise CliError(f"the demo prompts are missing from the installation: {DEMO_PROMPTS}")
    folder = Path(args.dir).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    db_path = folder / "demo.db"
    try:
        url = resolve_url(str(db_path))
        engine = open_engine(url)
    except DatabaseError as exc:
        raise CliError(str(exc)) from None
    host = "127.0.0.1"
    sock = bind_socket(host, args.port)
    port = sock.getsockname()[1]
    stamp = time.strftime("%H%M%S")
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        sim_a = stack.enter_context(running_in_thread(healthy_sim(args.tokens_per_s)))
        sim_b = stack.enter_context(running_in_thread(SimConfig(
            reasoning_field="both", tokens_per_s=args.tokens_per_s * 1.5, ttft_ms=250,
            reasoning_tokens="40-160", content_tokens="20-80", seed=2, token_ids="deepseek")))
        launched: list[launch.Launched] = []
        stack.callback(_stop_workers, procs)
        # one worker at a time, each once its run exists: the healthy run always gets the lower id (two workers
        # started together raced to create their runs, and the ids swapped between launches)
        for data in run_configs(sim_a, sim_b, stamp=stamp, concurrency=args.concurrency,
                                tokenizer=not args.no_tokenizer):
            try:
                config = build_config(data, "the demo")
            except ConfigError as exc:
                raise CliError(str(exc)) from None
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            lw = launch.start_worker(config, url, env=env)
            procs.append(lw._proc)  # type: ignore[attr-defined]
            launched.append(lw)
            try:
                launch.wait_for_run(lw, engine, timeout_s=60)
            except launch.LaunchError as exc:
                raise CliError(f"demo run {lw.name} did not start: {exc}") from None

        def drift() -> None:
            with contextlib.suppress(OSError):
                patch_sim(sim_b, {"reasoning_field": "reasoning"})
                print(f"[demo] run B's server now sends `reasoning` only (like vLLM >= 0.16); run {launched[1].name} "
                      "still reads `reasoning_content`: its alarm names both fields and pauses it within seconds",
                      flush=True)

        stop_faults = threading.Event()
        stack.callback(stop_faults.set)
        threading.Thread(target=faults_after_window, args=(engine, launched[0].run_id, sim_a),
                         kwargs={"stop": stop_faults}, daemon=True).start()
        timers = [threading.Timer(max(0.0, args.drift_after_s), drift)]
        settings = get_settings().model_copy(update={"db": str(db_path), "host": host, "port": port})
        app = create_app(url, settings)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        if args.duration_s:
            timers.append(threading.Timer(args.duration_s, lambda: setattr(server, "should_exit", True)))
        for t in timers:
            t.daemon = True
            t.start()
            stack.callback(t.cancel)
        base = f"http://{host}:{port}"
        print(f"synthwatch demo: dashboard at {base}/runs", flush=True)
        for lw in launched:
            print(f"  run {lw.name}: {base}/runs/{lw.run_id}  (log {lw.log_path})", flush=True)
        print(f"  database {db_path}; Ctrl-C stops everything", flush=True)
        from ..store.dashboards import forget_dashboard, record_dashboard

        row = record_dashboard(engine, base)  # the workers' alarm links and the CLI find it through the database
        stack.callback(forget_dashboard, engine, row)
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it caught: we handle it
            server.run(sockets=[sock])
        print("synthwatch demo: stopping the workers and simulators ...", flush=True)
    # the stack closed: workers stopped (their records written), simulators and the dashboard down
    run_ids = [lw.run_id for lw in launched if lw.run_id is not None]
    kept = _records_kept(engine, run_ids)
    engine.dispose()
    print(f"synthwatch demo: stopped: {kept} records kept in {db_path} "
          f"(see them again: {hint('serve', db=str(db_path))})", flush=True)
    return 0


def _records_kept(engine: Any, run_ids: list[int]) -> int:
    from sqlalchemy import bindparam, text

    if not run_ids:
        return 0
    with engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM record WHERE run_id IN :ids AND status = 'ok'")
                         .bindparams(bindparam("ids", expanding=True)), {"ids": run_ids}).scalar()
    return int(n or 0)


def _stop_workers(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    """Graceful stop first (SIGINT: in-flight requests finish), then SIGTERM, then kill."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)  # a second SIGINT: stop now, in-flight records back to pending
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
