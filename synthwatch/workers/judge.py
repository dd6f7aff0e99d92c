"""Judge models (#30): an OpenAI-compatible endpoint grades finished records, off the generation path.

A run with ``[judge]`` (config.JudgeConfig) gets a :class:`JudgeRunner`: an asyncio loop of its own (in a thread of
the ``synthwatch run`` process, or the ``synthwatch judge RUN`` command) with its own HTTP session and concurrency.
It reads ok records the writer stored, keeps the sampled share (``sample_fraction``, drawn from the record id:
a resume judges the same records), renders ``prompt_template`` and asks for a verdict ``{score, label, reason}``:

- with response_format ``json_schema`` (guided decoding on vLLM / SGLang) when ``guided`` allows it; with
  ``auto`` a server that refuses it (HTTP 400) is asked again without, and from then on;
- the reply is validated in every case (JSON, the schema, sizes bounded); a reply that is not a verdict, or a
  judge that keeps failing, is the judge's ``error`` verdict on that record, never an exception.

Each verdict is a check_verdict row (check_name ``judge``; fail when its label is one of ``bad_labels`` or its score
is below ``min_score``). The runner keeps the judge's check_stat row (rates on the dashboard and ``synthwatch
checks``), evaluates its alarm rule (``alarm_*``, ``auto_pause``) with the run's AlarmKeeper, and counts its
requests and tokens in judge_usage, apart from the run's own.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..check_catalog import extended_rule
from ..config import EndpointPoolConfig, JudgeConfig
from ..hints import command as hint
from ..outbound import register, run_sync
from ..quality import detection
from ..quality import verdicts as vd
from ..quality.detection.alarms import AlarmKeeper
from ..quality.judge_view import CHECK
from ..quality.verifiers import reference_of
from ..redact import redact
from ..store import queue as store
from ..store import rows as store_rows
from .client import Requester
from .endpoints import EndpointPool

log = logging.getLogger("synthwatch.judge")

FIELD_MAX = 20_000  # characters of the prompt, reasoning or answer put into a judge request
BATCH = 200
IDLE_S = 0.5  # how long the runner waits before looking for newly stored records
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "label": {"type": "string", "maxLength": 40},
        "reason": {"type": "string", "maxLength": 500},
    },
    "required": ["score", "label", "reason"],
    "additionalProperties": False,
}
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


class JudgeReply(BaseModel):
    """A judge's verdict as validated (whatever the server was asked for)."""

    model_config = ConfigDict(extra="ignore")

    score: float = Field(ge=0, le=1)
    label: str = Field(min_length=1, max_length=40)
    reason: str = Field("", max_length=2000)


def sampled(run_id: int, record_id: int, fraction: float) -> bool:
    """Whether a record is in the judge's sample: a stable draw from (run, record), so a resume agrees."""
    if fraction >= 1:
        return True
    h = hashlib.blake2b(f"{run_id}:{record_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64 < fraction


def _clip(value: Any) -> str:
    s = value if isinstance(value, str) else ("" if value is None else str(value))
    return s if len(s) <= FIELD_MAX else s[:FIELD_MAX] + " …[cut]"


def row_fields_read(cfg: JudgeConfig | None) -> tuple[str, ...]:
    """The dataset row fields the judge's template reads (kept with each record): reference_field for {reference}."""
    return (cfg.reference_field,) if cfg is not None and "{reference}" in cfg.prompt_template else ()


def missing_fields(cfg: JudgeConfig | None, rows: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """The fields the template reads that no row has (the template cannot be filled: the run is refused)."""
    want = row_fields_read(cfg)
    found: set[str] = set()
    for row in rows:
        if row:
            found.update(f for f in want if f not in found and reference_of(row, f) is not None)
        if len(found) == len(want):
            break
    return [f for f in want if f not in found]


def unkept_fields(engine: Engine, run_id: int, cfg: JudgeConfig | None) -> str | None:
    """Why the judge cannot run on this run's records (None when it can): its {reference} field is in no row the
    records kept (record.row_json is fixed when the dataset is loaded: a [judge] added later may find it absent)."""
    if not row_fields_read(cfg):
        return None
    with engine.connect() as conn:
        rows = [vd.row_fields(r[0]) for r in conn.execute(text(
            "SELECT row_json FROM record WHERE run_id = :r AND idx >= 0 ORDER BY id LIMIT 1000"), {"r": run_id})]
        conn.rollback()
    missing = missing_fields(cfg, rows) if rows else []
    if not missing:
        return None
    kept = ", ".join(dict.fromkeys(k for r in rows for k in r)) or "none"
    return (f"judge.prompt_template uses {{reference}}, but no record of the run kept the dataset field {missing[0]!r}"
            f" (judge.reference_field); the fields kept: {kept} (a run keeps the fields its checks and [judge] read"
            " when its dataset is loaded)")


def render(template: str, rec: dict[str, Any], reference_field: str = "reference") -> str:
    """The judge's message: the template with {prompt}, {reasoning}, {answer}, {reference} replaced (only those:
    braces elsewhere in the template, e.g. a JSON example, stay as written); {reference} is the dataset row's
    ``reference_field``."""
    try:
        msgs = orjson.loads(rec.get("prompt_json") or "[]")
    except orjson.JSONDecodeError:
        msgs = []
    if isinstance(msgs, dict):  # a prompt with tools
        msgs = msgs.get("messages") or []
    prompt = "\n".join(f"{m.get('role', '?')}: {m.get('content') if isinstance(m.get('content'), str) else ''}"
                       for m in msgs if isinstance(m, dict))
    row = vd.row_fields(rec.get("row_json"))
    values = {"prompt": prompt, "reasoning": rec.get("reasoning"), "answer": rec.get("content"),
              "reference": reference_of(row, reference_field)}
    return re.sub(r"\{(prompt|reasoning|answer|reference)\}", lambda m: _clip(values[m.group(1)]), template)


def parse_reply(content: str, cfg: JudgeConfig) -> vd.Verdict:
    """The judge's reply to a verdict; ValueError (with a short reason) when it is not one."""
    raw = content.strip()
    m = _FENCE.match(raw)
    if m:
        raw = m.group(1)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError(f"the judge's reply is not JSON: {redact(raw[:120])!r}") from None
    try:
        reply = JudgeReply.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise ValueError(f"the judge's reply is not a verdict: {where}: {first['msg']}") from None
    label = reply.label.strip().lower()
    bad = label in {b.lower() for b in cfg.bad_labels} or (cfg.min_score is not None and reply.score < cfg.min_score)
    return vd.Verdict("fail" if bad else "pass", reply.score, label, reply.reason.strip() or None)


@dataclass
class Usage:
    requests: int = 0
    failed_attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    states: dict[str, int] = field(default_factory=dict)


class JudgeRunner:
    """Judges one run's records (see the module's words). ``run(stop)`` until ``stop`` is set; ``drain``: go on
    until nothing is left to judge (bounded by ``deadline``)."""

    def __init__(self, engine: Engine, run_id: int, cfg: JudgeConfig, *, run_name: str = "",
                 retry_errors: bool = False) -> None:
        self.engine = engine
        # retry_errors (`synthwatch judge RUN --retry-errors`): judge again, once each, only the records whose
        # verdict in force is the judge's error; the error stays in the history
        self.retry_errors = retry_errors
        self.retried: set[int] = set()
        self.run_id = run_id
        self.run_name = run_name
        self.cfg = cfg
        self.pool = EndpointPool([cfg.endpoint], EndpointPoolConfig())  # raises MissingApiKey at once
        self.guided = cfg.guided != "none"
        self.after = 0  # records up to this id were looked at
        self.pending: list[vd.NewVerdict] = []
        self.usage = Usage()
        self.rule = replace(extended_rule(CHECK), title="The judge says bad", threshold=cfg.alarm_threshold,
                            window=cfg.alarm_window, min_records=cfg.alarm_min_records, auto_pause=cfg.auto_pause,
                            pause_threshold=cfg.alarm_threshold, pause_min_records=cfg.alarm_min_records)
        self.keeper = AlarmKeeper(run_id, run_name)
        self.window: deque[bool] = deque(maxlen=cfg.alarm_window)
        self.judged = 0

    # ------------------------------------------------------------------ reading

    def _candidates(self) -> tuple[bool, list[dict[str, Any]]]:
        """(whether any record past the cursor was looked at, the sampled ones of them still to judge)."""
        if self.retry_errors:
            return self._errored()
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(text(
                # a verdict older than the record's output (a re-run replaced it) does not count: judged again
                "SELECT r.id, r.prompt_json, r.reasoning, r.content, r.row_json FROM record r WHERE r.run_id = :r"
                " AND r.status = 'ok' AND r.idx >= 0 AND r.id > :after AND NOT EXISTS (SELECT 1 FROM check_verdict v"
                " WHERE v.record_id = r.id AND v.check_name = :c AND v.state != 'pending'"
                " AND v.created_at >= COALESCE(r.finished_at, 0)) ORDER BY r.id LIMIT :n"),
                {"r": self.run_id, "after": self.after, "c": CHECK, "n": BATCH}).mappings()]
            conn.rollback()
        if rows:
            self.after = int(rows[-1]["id"])
        return bool(rows), [r for r in rows if sampled(self.run_id, int(r["id"]), self.cfg.sample_fraction)]

    def _errored(self) -> tuple[bool, list[dict[str, Any]]]:
        """_candidates for retry_errors: the records past the cursor whose latest judge verdict is 'error', each
        once in this runner's life (a judge still failing leaves its new error for another retry)."""
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(text(
                "SELECT r.id, r.prompt_json, r.reasoning, r.content, r.row_json FROM check_verdict v JOIN record r"
                " ON r.id = v.record_id WHERE v.run_id = :r AND v.check_name = :c AND v.state = 'error' AND r.status"
                " = 'ok' AND r.id > :after AND NOT EXISTS (SELECT 1 FROM check_verdict w WHERE w.record_id ="
                " v.record_id AND w.check_name = v.check_name AND w.id > v.id) ORDER BY r.id LIMIT :n"),
                {"r": self.run_id, "after": self.after, "c": CHECK, "n": BATCH}).mappings()]
            conn.rollback()
        if rows:
            self.after = int(rows[-1]["id"])
        todo = [r for r in rows if int(r["id"]) not in self.retried]
        self.retried.update(int(r["id"]) for r in todo)
        return bool(rows), todo

    def _low_water(self) -> int | None:
        """The lowest id of a record of the run not finished yet: records below it that finished after the cursor
        passed them are looked at again from there (records finish out of id order)."""
        with self.engine.connect() as conn:
            low = conn.execute(text("SELECT MIN(id) FROM record WHERE run_id = :r AND status IN ('pending',"
                                    " 'in_flight')"), {"r": self.run_id}).scalar()
            conn.rollback()
        return None if low is None else int(low)

    # ------------------------------------------------------------------ asking

    def body(self, rec: dict[str, Any]) -> bytes:
        b: dict[str, Any] = {"model": self.cfg.model, "stream": False, "max_tokens": self.cfg.max_tokens,
                             "temperature": self.cfg.temperature,
                             "messages": [{"role": "user", "content": render(self.cfg.prompt_template, rec,
                                                                           self.cfg.reference_field)}]}
        if self.guided:
            b["response_format"] = {"type": "json_schema",
                                    "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
        return orjson.dumps(b)

    def requester(self) -> Requester:
        """The judge's client: the worker's (synthwatch/outbound.py's policy), each reply within cfg.timeout_s."""
        return Requester(connect_timeout_s=min(10.0, self.cfg.timeout_s), total_timeout_s=self.cfg.timeout_s,
                         idle_timeout_s=self.cfg.timeout_s, caller="judge")

    async def judge_one(self, requester: Any, rec: dict[str, Any]) -> vd.Verdict:
        """One record's verdict: never raises (a failure is the judge's error verdict)."""
        last = "no attempt"
        for attempt in range(self.cfg.max_attempts):
            ep = self.pool.pick()
            asked_schema = self.guided  # several requests are in flight: each answer is about its own request
            res = await requester.attempt(ep, self.body(rec), False)
            self.usage.requests += 1
            usage = (res.extracted.usage if res.extracted is not None else None) or {}
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0) if isinstance(usage, dict) else 0
            if res.ok:
                try:
                    return parse_reply(res.extracted.content or "", self.cfg)
                except ValueError as exc:
                    self.usage.failed_attempts += 1
                    last = str(exc)
                    continue
            self.usage.failed_attempts += 1
            last = res.message or res.kind
            if res.status_code == 400 and asked_schema and self.cfg.guided == "auto":
                if self.guided:  # the server does not take response_format: ask in words from now on
                    self.guided = False
                    log.info("judge: the server refused response_format json_schema; asking without it")
                continue
            if res.status_code is not None and res.status_code not in RETRY_STATUS:
                break
            await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
        return vd.Verdict("error", reason=f"the judge failed: {redact(last)[:300]}")

    # ------------------------------------------------------------------ writing

    async def flush(self) -> None:
        """Write the verdicts and counts so far. Taken here, in the loop's thread (the requests add to them there),
        and written in a thread of their own (the loop never waits for the database)."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        usage, self.usage = self.usage, Usage()
        try:
            await asyncio.to_thread(self._write, batch, usage)
        except Exception as exc:  # noqa: BLE001 - the judge never stops on a write: each row is isolated (store/rows)
            # a transient error (a locked file, a lost connection): the batch is kept and written with the next flush
            transient = store_rows.is_transient(exc)
            log.warning("judge: writing %d verdicts failed (%s: %s); %s", len(batch), type(exc).__name__,
                        redact(str(exc))[:300], "retried with the next batch" if transient else
                        "those records have no judge verdict yet (the drain pass or `"
                        + hint("judge", run=self.run_name or "RUN",
                               db=self.engine.url.render_as_string(hide_password=True)) + "` asks again)")
            if not transient:
                return
            self.pending[:0] = batch
            self.usage.requests += usage.requests
            self.usage.failed_attempts += usage.failed_attempts
            self.usage.prompt_tokens += usage.prompt_tokens
            self.usage.completion_tokens += usage.completion_tokens
            await asyncio.sleep(IDLE_S)

    def _write(self, batch: list[vd.NewVerdict], usage: Usage) -> None:
        t = time.time()
        with self.engine.connect() as conn, store.write_begin(conn):
            vd.append(conn, batch, t)
            # a judge answering prose, bad JSON or nothing gives error verdicts: past the run's error share, an alarm
            detection.error_share_alarms(conn, self.run_id, {v.check_name for v in batch},
                                         detection.run_error_share(conn, self.run_id), t)
            states = {s: sum(v.verdict.state == s for v in batch) for s in ("pass", "fail", "error")}
            judged = [v for v in batch if v.verdict.state in ("pass", "fail")]
            self.window.extend(v.verdict.state == "fail" for v in judged)
            self._usage_row(conn, usage, states, t)
            self._stat_row(conn, t, judged)
        self.judged += len(batch)

    def _usage_row(self, conn: Any, u: Usage, states: dict[str, int], t: float) -> None:
        params = {"r": self.run_id, "q": u.requests, "f": u.failed_attempts, "p": states["pass"],
                  "x": states["fail"], "e": states["error"], "pt": u.prompt_tokens, "ct": u.completion_tokens,
                  "g": "json_schema" if self.guided else "prompt", "t": t}
        done = conn.execute(text(
            "UPDATE judge_usage SET requests = requests + :q, failed_attempts = failed_attempts + :f, n_pass = n_pass"
            " + :p, n_fail = n_fail + :x, n_error = n_error + :e, prompt_tokens = prompt_tokens + :pt,"
            " completion_tokens = completion_tokens + :ct, guided = :g, updated_at = :t WHERE run_id = :r"),
            params).rowcount
        if not done:
            conn.execute(text(
                "INSERT INTO judge_usage (run_id, requests, failed_attempts, n_pass, n_fail, n_error, prompt_tokens,"
                " completion_tokens, guided, updated_at) VALUES (:r, :q, :f, :p, :x, :e, :pt, :ct, :g, :t)"), params)

    def _stat_row(self, conn: Any, t: float, judged: list[vd.NewVerdict]) -> None:
        """The judge's rates (check_stat, as the writer keeps a check's) and its alarm rule."""
        n_fail, n_total = conn.execute(text(
            "SELECT COALESCE(SUM(CASE WHEN v.state = 'fail' THEN 1 ELSE 0 END), 0), COUNT(*) FROM check_verdict v"
            " JOIN (SELECT record_id, MAX(id) AS id FROM check_verdict WHERE run_id = :r AND check_name = :c"
            " GROUP BY record_id) m ON m.id = v.id WHERE v.state IN ('pass', 'fail')"),
            {"r": self.run_id, "c": CHECK}).one()
        example = next((v.record_id for v in reversed(judged) if v.verdict.state == "fail"), None)
        win_fail, win_total = sum(self.window), len(self.window)
        params = {"r": self.run_id, "c": CHECK, "nf": int(n_fail), "nt": int(n_total), "wf": win_fail,
                  "wt": win_total, "ex": example, "t": t}
        if not conn.execute(text(
                "UPDATE check_stat SET n_fail = :nf, n_total = :nt, win_fail = :wf, win_total = :wt,"
                " example_record_id = COALESCE(:ex, example_record_id), updated_at = :t"
                " WHERE run_id = :r AND check_name = :c"), params).rowcount:
            conn.execute(text(
                "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, example_record_id,"
                " updated_at) VALUES (:r, :c, :nf, :nt, :wf, :wt, :ex, :t)"), params)
        last_fail = next((v for v in reversed(judged) if v.verdict.state == "fail"), None)
        details = {CHECK: {"reason": last_fail.verdict.reason or ""}} if last_fail else {}
        self.keeper.evaluate(conn, t, {CHECK: self.rule}, {CHECK: (win_fail, win_total)},
                             {CHECK: (int(n_fail), int(n_total), example)}, details,
                             new_fail={CHECK: t} if last_fail else None)

    # ------------------------------------------------------------------ the loop

    async def run(self, stop: threading.Event, *, drain_deadline: list[float] | None = None) -> int:
        """Judge until ``stop`` is set; then, while ``drain_deadline[0]`` (a monotonic time) is not passed, what is
        left. Returns how many verdicts were written."""
        sem = asyncio.Semaphore(self.cfg.concurrency)

        async def one(rec: dict[str, Any]) -> None:
            async with sem:
                t0 = time.perf_counter()
                verdict = await self.judge_one(requester, rec)
                self.pending.append(vd.NewVerdict(self.run_id, int(rec["id"]), CHECK, verdict,
                                                  round((time.perf_counter() - t0) * 1000, 1)))

        async with self.requester() as requester:
            low_seen: int | None = 0  # the low water mark when the cursor last came to the end
            full_pass, found = False, False  # draining: a pass from the first record, and whether it found any
            while True:
                draining = stop.is_set()
                if draining and (drain_deadline is None or time.monotonic() > drain_deadline[0]):
                    break
                seen, recs = await asyncio.to_thread(self._candidates)
                if recs:
                    found = True
                    tasks = [asyncio.create_task(one(r)) for r in recs]
                    for done in asyncio.as_completed(tasks):
                        await done
                        if len(self.pending) >= max(1, self.cfg.concurrency):
                            await self.flush()
                    await self.flush()
                    continue
                if seen:
                    continue
                # the cursor is at the end
                if draining:
                    if full_pass and not found:
                        break  # a pass from the first record found nothing to judge
                    self.after, full_pass, found = 0, True, False
                    continue
                await asyncio.sleep(IDLE_S)
                low = await asyncio.to_thread(self._low_water)
                if low != low_seen:  # records below the cursor may have finished since: from the low water mark
                    self.after = min(self.after, (low or 1) - 1) if low is not None else 0
                    low_seen = low
        await self.flush()
        return self.judged


def start_in_thread(engine: Engine, run_id: int, cfg: JudgeConfig, run_name: str = "") -> JudgeThread:
    return JudgeThread(JudgeRunner(engine, run_id, cfg, run_name=run_name)).start()


class JudgeThread:
    """A JudgeRunner in a thread with its own event loop: the worker's loop never waits for the judge."""

    def __init__(self, runner: JudgeRunner) -> None:
        self.runner = runner
        self.stop = threading.Event()
        self.deadline = [float("inf")]
        self.error: str | None = None
        self.thread = threading.Thread(target=self._main, name="synthwatch-judge", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.runner.run(self.stop, drain_deadline=self.deadline))
        except Exception as exc:  # noqa: BLE001 - the judge never takes the run down: said, and the run goes on
            self.error = f"{type(exc).__name__}: {redact(str(exc))[:300]}"
            log.error("judge stopped: %s", self.error)

    def start(self) -> JudgeThread:
        self.thread.start()
        return self

    def finish(self, drain_s: float) -> None:
        """Judge what is left for at most ``drain_s`` seconds, then stop."""
        self.deadline[0] = time.monotonic() + drain_s
        self.stop.set()
        self.thread.join(drain_s + 30)


@register("judge", "the judge's requests (workers/judge.py JudgeRunner.judge_one), not streamed", 10.0)
def _drive_judge(base_url: str, key_env: str) -> str:
    from ..config import EndpointConfig

    cfg = JudgeConfig(endpoint=EndpointConfig(base_url=base_url, api_key_env=key_env), model="m", timeout_s=3.0,
                      max_attempts=1)
    runner = JudgeRunner(None, 0, cfg)  # type: ignore[arg-type]  # no database: one verdict, not written
    rec = {"id": 1, "prompt_json": '[{"role": "user", "content": "q"}]', "reasoning": "", "content": "a",
           "row_json": None}

    async def go() -> str:
        async with runner.requester() as req:
            v = await runner.judge_one(req, rec)
        return f"{v.state}: {getattr(v, 'label', '')} {v.reason}"

    return run_sync(go())
