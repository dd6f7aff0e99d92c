"""The client loops the worker benchmarks compare, and the pinned child process that runs them.

Three ways to send the same prompts to the simulator and keep the answers:

- ``raw``: the ceiling. aiohttp + orjson, a few lines of SSE splitting, reasoning and content
  joined in memory, nothing stored. No real client can do less work per chunk.
- ``openai``: common practice. ``openai.AsyncOpenAI`` with its defaults (httpx), one pydantic
  model per streamed chunk.
- ``worker``: synthwatch's :class:`RunWorker`, built exactly as ``synthwatch run`` builds it (the
  checks' writer hooks included), persisting every record to a SQLite file in WAL mode.
- ``process``: the whole ``synthwatch run`` command in a process of its own, start-up, dataset load and
  shutdown included (CPU from ``wait4``).

Each measurement runs in a long-lived child process (``python -m bench.clients``) pinned to one
core; the parent sends one JSON command per line on stdin and reads one JSON result per line.
CPU time is the child's own (all threads: the worker's writer thread and SQLite included),
measured around the timed part only, so interpreter start-up and imports do not count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

MODEL = "sim-reasoner"


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def load_messages(dataset: str | Path) -> list[list[dict[str, Any]]]:
    with open(dataset, "rb") as fh:
        return [orjson.loads(line)["messages"] for line in fh if line.strip()]


def request_body(messages: list[dict[str, Any]], stream: bool) -> bytes:
    """The same bytes RunWorker.body_for sends (same keys, same order), so the simulator's cache hits."""
    body: dict[str, Any] = {"model": MODEL, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body["messages"] = messages
    return orjson.dumps(body)


class _Tally:
    __slots__ = ("ok", "failed", "chunks", "tokens", "reasoning_chars", "first_error")

    def __init__(self) -> None:
        self.ok = self.failed = self.chunks = self.tokens = self.reasoning_chars = 0
        self.first_error: str | None = None

    def fail(self, why: str) -> None:
        self.failed += 1
        if self.first_error is None:
            self.first_error = why


async def _pool(n_requests: int, concurrency: int, one: Any) -> None:
    """Run ``one(i)`` for i in range(n_requests) with at most ``concurrency`` in flight."""
    next_i = 0

    async def lane() -> None:
        nonlocal next_i
        while next_i < n_requests:
            i = next_i
            next_i += 1
            await one(i)

    await asyncio.gather(*(lane() for _ in range(min(concurrency, n_requests))))


# ------------------------------------------------------------------------------- raw ceiling


async def raw_client(base_url: str, messages: list[list[dict[str, Any]]], n_requests: int, concurrency: int,
                     stream: bool) -> _Tally:
    """The minimal client: aiohttp, orjson, split on blank lines; no retries, no database."""
    url = base_url.rstrip("/") + "/chat/completions"
    bodies = [request_body(m, stream) for m in messages]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    tally = _Tally()
    loads = orjson.loads
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def one(i: int) -> None:
            reasoning: list[str] = []
            content: list[str] = []
            finish = None
            try:
                async with session.post(url, data=bodies[i % len(bodies)], headers=headers) as resp:
                    if resp.status != 200:
                        tally.fail(f"HTTP {resp.status}")
                        return
                    if not stream:
                        body = loads(await resp.read())
                        choice = body["choices"][0]
                        msg = choice["message"]
                        reasoning.append(msg.get("reasoning") or "")
                        content.append(msg.get("content") or "")
                        finish = choice["finish_reason"]
                        tally.tokens += body["usage"]["completion_tokens"]
                    else:
                        rest = b""
                        done = False
                        async for data in resp.content.iter_any():
                            events = (rest + data).split(b"\n\n") if rest else data.split(b"\n\n")
                            rest = events.pop()
                            for event in events:
                                payload = event[6:]  # b"data: "
                                if payload == b"[DONE]":
                                    done = True
                                    continue
                                chunk = loads(payload)
                                tally.chunks += 1
                                choices = chunk["choices"]
                                if choices:
                                    c = choices[0]
                                    delta = c["delta"]
                                    r = delta.get("reasoning")
                                    if r:
                                        reasoning.append(r)
                                    t = delta.get("content")
                                    if t:
                                        content.append(t)
                                    if c["finish_reason"]:
                                        finish = c["finish_reason"]
                                usage = chunk.get("usage")
                                if usage:
                                    tally.tokens += usage["completion_tokens"]
                        if not done:
                            tally.fail("stream ended without [DONE]")
                            return
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                tally.fail(f"{exc.__class__.__name__}: {exc}")
                return
            text = "".join(reasoning)
            answer = "".join(content)
            if finish is None or not answer:
                tally.fail("no finish_reason or empty content")
                return
            tally.reasoning_chars += len(text)
            tally.ok += 1

        await _pool(n_requests, concurrency, one)
    return tally


# ------------------------------------------------------------------------------- openai client


async def openai_client(base_url: str, messages: list[list[dict[str, Any]]], n_requests: int, concurrency: int,
                        stream: bool) -> _Tally:
    """What most scripts do: AsyncOpenAI with its defaults, reading ``delta.reasoning`` per chunk."""
    import openai

    tally = _Tally()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)

    def reasoning_of(obj: Any) -> str:
        value = getattr(obj, "reasoning", None)
        if value is None and obj.model_extra:
            value = obj.model_extra.get("reasoning")
        return value or ""

    async def one(i: int) -> None:
        msgs: Any = messages[i % len(messages)]
        reasoning: list[str] = []
        content: list[str] = []
        finish = None
        try:
            if stream:
                response = await client.chat.completions.create(
                    model=MODEL, messages=msgs, stream=True, stream_options={"include_usage": True})
                async for chunk in response:
                    tally.chunks += 1
                    if chunk.choices:
                        c = chunk.choices[0]
                        r = reasoning_of(c.delta)
                        if r:
                            reasoning.append(r)
                        if c.delta.content:
                            content.append(c.delta.content)
                        if c.finish_reason:
                            finish = c.finish_reason
                    if chunk.usage:
                        tally.tokens += chunk.usage.completion_tokens
            else:
                completion = await client.chat.completions.create(model=MODEL, messages=msgs)
                choice = completion.choices[0]
                reasoning.append(reasoning_of(choice.message))
                content.append(choice.message.content or "")
                finish = choice.finish_reason
                if completion.usage:
                    tally.tokens += completion.usage.completion_tokens
        except openai.OpenAIError as exc:
            tally.fail(f"{exc.__class__.__name__}: {exc}")
            return
        if finish is None or not "".join(content):
            tally.fail("no finish_reason or empty content")
            return
        tally.reasoning_chars += len("".join(reasoning))
        tally.ok += 1

    try:
        await _pool(n_requests, concurrency, one)
    finally:
        await client.close()
    return tally


def measure_client(kind: str, base_url: str, dataset: str, n_requests: int, concurrency: int,
                   stream: bool) -> dict[str, Any]:
    messages = load_messages(dataset)
    fn = raw_client if kind == "raw" else openai_client
    if kind == "openai":
        import openai  # noqa: F401  (imported before the clock starts)
    c0, t0 = cpu_s(), time.perf_counter()
    tally = asyncio.run(fn(base_url, messages, n_requests, concurrency, stream))
    elapsed, cpu = time.perf_counter() - t0, cpu_s() - c0
    return {"ok": tally.ok, "failed": tally.failed, "chunks": tally.chunks, "tokens": tally.tokens,
            "reasoning_chars": tally.reasoning_chars, "elapsed_s": elapsed, "cpu_s": cpu,
            "first_error": tally.first_error}


# ------------------------------------------------------------------------------- synthwatch worker


def _new_run(base_url: str, dataset: str, db: str, stream: bool, **config: Any) -> tuple[Any, Any, int]:
    """A fresh database with the dataset loaded into a new run, as `synthwatch run` does it (untimed)."""
    from synthwatch.config import RunConfig
    from synthwatch.sources.load import prepare_run
    from synthwatch.store.db import open_engine

    engine = open_engine(db)
    run_config = RunConfig.model_validate({
        "name": Path(db).stem, "dataset": {"path": dataset}, "endpoints": [{"base_url": base_url}],
        "model": MODEL, "stream": stream, **config})
    with open(os.devnull, "w") as devnull:
        run_id, _ = prepare_run(engine, run_config, out=devnull)
    return engine, run_config, run_id


def measure_worker(base_url: str, dataset: str, db: str, concurrency: int, stream: bool,
                   idle_timeout_s: float = 60.0, sample_rss: bool = False,
                   deadline_s: float | None = None, settings: dict[str, str] | None = None,
                   trace_top: int = 0) -> dict[str, Any]:
    """Load the dataset into a fresh run (untimed), then time RunWorker.main() to completion.

    The worker is built as ``synthwatch run`` builds it: writer hooks from synthwatch.quality.checks, default
    flush interval, retries and lease; the progress line is off (``--quiet``). ``settings``: process settings
    (synthwatch/settings.py) for this measurement only, e.g. ``{"inflight_checks": "false"}``. ``trace_top``: trace
    allocations (tracemalloc, which slows the worker) and return the ``trace_top`` largest holders at the traced peak.
    """
    saved = {k: os.environ.get(k) for k in (f"SYNTHWATCH_{n.upper()}" for n in settings or {})}
    os.environ.update({f"SYNTHWATCH_{k.upper()}": v for k, v in (settings or {}).items()})
    try:
        return _measure_worker(base_url, dataset, db, concurrency, stream, idle_timeout_s, sample_rss, deadline_s,
                               trace_top)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _measure_worker(base_url: str, dataset: str, db: str, concurrency: int, stream: bool, idle_timeout_s: float,
                    sample_rss: bool, deadline_s: float | None, trace_top: int = 0) -> dict[str, Any]:
    from sqlalchemy import text

    from synthwatch.workers.engine import RunWorker

    engine, config, run_id = _new_run(base_url, dataset, db, stream, concurrency=concurrency,
                                      timeouts={"idle_s": idle_timeout_s})
    hooks: list[Any] = []
    checks = "off (synthwatch.quality.checks.writer_hooks missing)"
    try:
        from synthwatch.quality.live import writer_hooks
    except ImportError:
        pass
    else:
        hooks = writer_hooks(engine, run_id, config)
        checks = "on"
    worker = RunWorker(engine, run_id, config, hooks=hooks)
    peak_rss = 0

    async def go() -> str:
        nonlocal peak_rss
        sampler = asyncio.create_task(_rss_sampler(trace_top=trace_top)) if sample_rss else None
        watchdog = asyncio.create_task(_stop_after(worker, deadline_s)) if deadline_s else None
        try:
            return await worker.main()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if sampler is not None:
                sampler.cancel()
                peak_rss = await sampler

    c0, t0 = cpu_s(), time.perf_counter()
    final = asyncio.run(go())
    elapsed, cpu = time.perf_counter() - t0, cpu_s() - c0
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT SUM(status = 'ok'), SUM(status != 'ok'), COALESCE(SUM(n_chunks), 0),"
            " COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(reasoning_len), 0),"
            " SUM(status = 'timeout'), SUM(status IN ('pending', 'in_flight')) FROM record WHERE run_id = :r"),
            {"r": run_id}).one()
        errors = conn.execute(text(
            "SELECT error_kind, COUNT(*) FROM record WHERE run_id = :r AND status != 'ok' GROUP BY error_kind"),
            {"r": run_id}).all()
    engine.dispose()
    return {"ok": row[0] or 0, "failed": row[1] or 0, "chunks": row[2], "tokens": row[3], "reasoning_chars": row[4],
            "timeouts": row[5] or 0, "unfinished": row[6] or 0, "elapsed_s": elapsed, "cpu_s": cpu, "final": final, "checks": checks,
            "first_error": ", ".join(f"{k}: {n}" for k, n in errors) or None,
            "peak_rss_mb": peak_rss / 2**20 if sample_rss else None, "holders": _HOLDERS[:],
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# What any whole process that speaks HTTP with aiohttp and stores into SQLite through SQLAlchemy must start with.
STARTUP_FLOOR_IMPORTS = "import aiohttp, orjson, sqlalchemy, sqlite3"


def measure_startup_floor() -> dict[str, Any]:
    """The least start-up a whole process can have: a fresh interpreter importing the libraries the worker is
    built on (no synthwatch module, no database), exec to exit, CPU from wait4, on this process's core."""
    proc = subprocess.Popen([sys.executable, "-c", STARTUP_FLOOR_IMPORTS], cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{STARTUP_FLOOR_IMPORTS!r} exited {os.waitstatus_to_exitcode(status)}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime}


def measure_process(base_url: str, dataset: str, db: str, concurrency: int, stream: bool) -> dict[str, Any]:
    """The whole ``synthwatch run`` process, counted from exec to exit: interpreter start-up, imports, loading
    the dataset into a fresh database, the run, the shutdown flush. Its CPU (every thread) comes from wait4;
    it runs on this process's core (the affinity is inherited)."""
    from sqlalchemy import text

    from synthwatch.store.db import open_engine

    args = [sys.executable, "-m", "synthwatch", "run", "--dataset", dataset, "--base-url", base_url,
            "--model", MODEL, "--db", db, "--name", Path(db).stem, "--concurrency", str(concurrency), "--quiet"]
    if not stream:
        args.append("--no-stream")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"synthwatch run exited {proc.returncode}: {log.read()[-2000:]}")
    engine = open_engine(db)
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT SUM(status = 'ok'), SUM(status != 'ok'), COALESCE(SUM(n_chunks), 0),"
            " COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(reasoning_len), 0) FROM record")).one()
    engine.dispose()
    return {"ok": row[0] or 0, "failed": row[1] or 0, "chunks": row[2], "tokens": row[3], "reasoning_chars": row[4],
            "elapsed_s": elapsed, "cpu_s": usage.ru_utime + usage.ru_stime, "first_error": None}


def measure_floor(base_url: str, dataset: str, db: str, stream: bool, claim_batch: int = 64,
                  flush_batch: int = 256) -> dict[str, Any]:
    """SQLite's own share of persisting the records: the worker's claim and final UPDATE statements, run
    through sqlite3 directly (no HTTP, no checks, no Python bookkeeping), on the schema and pragmas the
    worker uses, with a real reply's text. What no worker on this schema can go below, per record."""
    import random
    import sqlite3
    import urllib.request

    from synthwatch.store.queue import claim_sql
    from synthwatch.workers.record_writes import FINAL_COLS, FINAL_UPDATE

    load0 = time.process_time()
    # what `synthwatch run` does to load the dataset: a fresh database (its schema) and prepare_run
    engine, _, run_id = _new_run(base_url, dataset, db, stream)
    load_s = time.process_time() - load0
    engine.dispose()
    req = urllib.request.Request(base_url.rstrip("/") + "/chat/completions",
                                 data=request_body(load_messages(dataset)[0], False),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        reply = orjson.loads(resp.read())
    msg = reply["choices"][0]["message"]
    usage = orjson.dumps(reply["usage"]).decode()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    claim = claim_sql()
    final_sql = FINAL_UPDATE.format(m="?")
    rnd = random.Random(1).random
    n = 0
    claim_s = 0.0
    c0, t0 = time.process_time(), time.perf_counter()
    while True:
        held: list[int] = []
        while len(held) < flush_batch:
            k0 = time.process_time()
            conn.execute("BEGIN IMMEDIATE")
            t = time.time()
            rows = conn.execute(claim, {"w": 1, "lease": t + 30, "t": t, "r": run_id, "n": claim_batch}).fetchall()
            conn.execute("UPDATE run SET n_in_flight = n_in_flight + ?, n_pending = n_pending - ? WHERE id = ?",
                         (len(rows), len(rows), run_id))
            conn.execute("COMMIT")
            claim_s += time.process_time() - k0
            held += [r[0] for r in rows]
            if len(rows) < claim_batch:
                break
        if not held:
            break
        t = time.time()
        values = {"status": "ok", "reasoning": msg.get("reasoning") or "", "content": msg.get("content") or "",
                  "content_null": 0, "reasoning_source": "reasoning", "finish_reason": "stop",
                  "prompt_tokens": reply["usage"].get("prompt_tokens"),
                  "completion_tokens": reply["usage"].get("completion_tokens"), "usage_json": usage,
                  "latency_s": 0.01, "ttft_s": None, "n_chunks": 0, "attempts": 1,
                  "attempts_json": '[{"n":1,"ok":true}]', "endpoint": "e", "model": MODEL, "finished_at": t,
                  "check_flags": 0, "gen_version": 1, "derive_version": 1, "rerun": 0, "turns_done": 1}
        values["reasoning_len"], values["content_len"] = len(values["reasoning"]), len(values["content"])
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(final_sql, [(*(values.get(c) if c != "rnd" else rnd() for c in FINAL_COLS), i, 1)
                                     for i in held])
        conn.executemany("INSERT OR IGNORE INTO record_fts_queue (record_id) VALUES (?)", [(i,) for i in held])
        conn.execute("UPDATE run SET n_ok = n_ok + ?, n_in_flight = n_in_flight - ? WHERE id = ?",
                     (len(held), len(held), run_id))
        conn.execute("COMMIT")
        n += len(held)
    cpu, elapsed = time.process_time() - c0, time.perf_counter() - t0
    conn.close()
    # load_s: the fresh database and the dataset's load into its run (synthwatch's own code, not in cpu_s); claim_s:
    # the claims' share of cpu_s
    return {"ok": n, "cpu_s": cpu, "elapsed_s": elapsed, "reasoning_chars": len(msg.get("reasoning") or ""),
            "claim_s": claim_s, "load_s": load_s}


async def _stop_after(worker: Any, deadline_s: float) -> None:
    """Stop the worker at once after deadline_s (what a second Ctrl-C does): a benchmark must end."""
    await asyncio.sleep(deadline_s)
    worker.local_stop = "stop_now"
    worker._wake.set()


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process, from /proc (0 where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_HOLDERS: list[str] = []  # the largest allocation sites at the traced peak (measure_worker's trace_top)


async def _rss_sampler(every_s: float = 0.5, trace_top: int = 0) -> int:
    """The peak VmRSS; with ``trace_top``, the top allocation sites (tracemalloc) whenever the RSS reaches a new
    peak 10% above the last one taken."""
    import tracemalloc

    _HOLDERS.clear()
    if trace_top:
        tracemalloc.start(12)
    peak = rss_bytes()
    shot = 0
    try:
        while True:
            await asyncio.sleep(every_s)
            now = rss_bytes()
            peak = max(peak, now)
            if trace_top and now > shot * 1.1 and now >= peak:
                shot = now
                stats = tracemalloc.take_snapshot().statistics("traceback")
                traced = sum(st.size for st in stats)
                _HOLDERS[:] = [f"at RSS {now / 2**20:.0f} MB, traced {traced / 2**20:.0f} MB:"] + [
                    f"{st.size / 2**20:.1f} MB in {st.count} blocks: "
                    + " <- ".join(f"{fr.filename.rsplit('/', 2)[-1]}:{fr.lineno}" for fr in list(st.traceback)[::-1][:6])
                    for st in stats[:trace_top]]
    except asyncio.CancelledError:
        if trace_top:
            tracemalloc.stop()
        return max(peak, rss_bytes())


# ------------------------------------------------------------------------------- parent side
# The simulator gets core 0 and every client measurement core 1 (the machine has two), so the
# client side is measured on exactly one core and the server never competes with it. On a machine
# with one core nothing is pinned and the tables say so.

ROOT = Path(__file__).resolve().parent.parent
PINNED = (os.cpu_count() or 1) >= 2
SIM_CORE = 0
CLIENT_CORE = 1
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _pin(core: int) -> Callable[[], None] | None:
    if not PINNED:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def pinning_note() -> str:
    if PINNED:
        return (f"Simulator pinned to core {SIM_CORE}, each client (one process, all its threads) to core "
                f"{CLIENT_CORE}")
    return "Only one core: nothing pinned, simulator and client share it (ratios still compare like with like)"


class SimProcess:
    """``synthwatch simulate`` in a subprocess on its own core; ``url`` is its /v1 base URL."""

    def __init__(self, **flags: Any) -> None:
        args = [sys.executable, "-m", "synthwatch", "simulate", "--port", "0"]
        for name, value in flags.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                                     preexec_fn=_pin(SIM_CORE))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"simulator did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1].strip()

    def cpu_s(self) -> float:
        """CPU seconds the simulator has used so far (from /proc; 0 without /proc)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICK
        except OSError:
            return 0.0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ClientChild:
    """A long-lived ``python -m bench.clients`` on the client core (imports paid once, off the clock)."""

    def __init__(self) -> None:
        args = [sys.executable, "-m", "bench.clients"]
        if PINNED:
            args += ["--cpu", str(CLIENT_CORE)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHWATCH_")}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        # stderr (worker logs, check alarms) goes to a file, shown only when something fails
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     cwd=ROOT, env=env)
        ready = self._read()
        self.pid = ready["ready"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"benchmark client process exited with code {code}; its stderr ends with:\n{self.log_tail()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        result = self._read()
        if "error" in result:
            raise RuntimeError(f"benchmark command {command} failed: {result['error']}\n{self.log_tail()}")
        return result

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-n:]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def workdir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="synthwatch-bench-")


def write_dataset(path: Path, n: int, distinct: int) -> Path:
    """n prompts with unique ids cycling through `distinct` questions (the simulator caches replies per body)."""
    with path.open("w") as fh:
        for i in range(n):
            k = i % distinct
            fh.write(json.dumps({"id": f"p{i}", "messages": [
                {"role": "user", "content": f"What is {3 + k % 97} + {5 + (k * 7) % 89 + k // 97}?"}]}) + "\n")
    return path


def median(values: Iterable[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:
        return "–"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def render(table: dict[str, Any]) -> str:
    """One result table as Markdown (title, text, table); the runner may use it as it is."""
    lines = [f"### {table['title']}", ""]
    if table.get("text"):
        lines += [table["text"], ""]
    cols = table["columns"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|")
    for row in table["rows"]:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines) + "\n"


DOC = ROOT / "docs" / "benchmarks.md"


def machine_lines() -> list[str]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as fh:
            kb = int(next(ln for ln in fh if ln.startswith("MemTotal")).split()[1])
            mem = f", {kb / 2**20:.0f} GB RAM"
    except (OSError, StopIteration):
        pass
    packages = []
    for name in ("synthwatch", "aiohttp", "orjson", "openai", "httpx", "sqlalchemy"):
        try:
            packages.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    try:
        with open("/proc/loadavg") as fh:
            load = " ".join(fh.read().split()[:3])
    except OSError:
        load = "unknown"
    return [
        f"- machine: {cpu}, {os.cpu_count()} cores{mem}; {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}; {', '.join(packages)}; SQLite {__import__('sqlite3').sqlite_version}",
        f"- load average when the section was written: {load} (the machine is shared)",
    ]


def write_section(key: str, tables: list[dict[str, Any]], command: str) -> None:
    """Replace this benchmark's section of docs/benchmarks.md (between its markers), or append it.

    Each benchmark module owns one marked section, so the modules can be run alone or together
    without overwriting each other's results."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = [start, f"_Written {stamp} by `{command}`._", "", *machine_lines(), ""]
    for t in tables:
        body += [render(t)]
    body.append(end)
    block = "\n".join(body)
    text = DOC.read_text() if DOC.exists() else (
        "# Benchmarks\n\n`./dev bench` (which runs `python -m bench`) runs the whole suite and rewrites the "
        "sections below. Every figure is measured side by side with its baseline in the same run, as a "
        "median over repeats.\n")
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)


# ------------------------------------------------------------------------------- child process


def serve(out: Any) -> None:
    """Answer JSON commands from stdin, one result line each, until stdin closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            kind = cmd.pop("kind")
            if kind == "worker":
                result = measure_worker(**cmd)
            elif kind == "floor":
                result = measure_floor(**cmd)
            elif kind == "process":
                result = measure_process(**cmd)
            elif kind == "startup_floor":
                result = measure_startup_floor()
            else:
                result = measure_client(kind, **cmd)
        except Exception as exc:  # reported to the parent, which fails the benchmark with it
            result = {"error": f"{exc.__class__.__name__}: {exc}"}
        out.write(json.dumps(result) + "\n")
        out.flush()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--cpu":
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, {int(sys.argv[2])})
    # Results go to the real stdout only; anything the code under test prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import openai  # noqa: F401  import once, before any measurement

    import synthwatch.workers.engine  # noqa: F401

    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    serve(out)


if __name__ == "__main__":
    main()
