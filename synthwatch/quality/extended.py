"""Extended checks while a run is live, and re-checking a run (#30).

Records are written first; their verdicts follow. The writer hook (:class:`ExtendedHook`) only hands the ids of
the ok records it just committed to :class:`ExtendedRunner`, whose threads (never the writer thread):

- *dispatchers*, one per check process (synthwatch.quality.check_pool): read a batch of records from the store
  and have the process check them (verifiers, user checks, TOML rules, language);
- the *verdict writer*: runs near_duplicate (one MinHash LSH index per run lives here), appends the verdicts to
  ``check_verdict`` (synthwatch.quality.verdicts) and, in the same transaction, adds them to ``check_stat`` and
  evaluates each extended check's alarm rule with the AlarmKeeper the built-in checks use: rates, alarms and
  auto-pause work by check name, exactly as for a built-in check.

The queue between them is bounded (``[checks.extended] queue_max``): when it is full the writer waits
(backpressure: logged, counted in :meth:`ExtendedRunner.stats`); nothing is dropped. A record without a
verdict yet is *pending* for that check (verdicts.pending_count). On shutdown the runner drains for
``drain_grace_s``; what is left stays pending, and is checked by the next worker's start (its backlog) or by
``synthwatch checks RUN --pending`` (:func:`recheck`; ``--recompute`` checks every record again).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import NEAR_DUPLICATE, NEAR_DUPLICATE_IN_PROMPT, CheckSettings, Rule
from ..hints import command as hint
from ..store import queue as store
from . import detection
from . import verdicts as vd
from .check_pool import CheckProcess, Result, pool_checks_budget, view_args
from .checks import ChecksConfigError, RecordView, view_from_row
from .detection import open_items
from .detection.alarms import AlarmKeeper, rules_for

log = logging.getLogger("synthwatch.checks")

BATCH = 32
WRITE_EVERY_S = 0.2
RELOAD_S = 2.0  # how often a live runner reads its run's rules again
NEAR_DUPLICATES = (NEAR_DUPLICATE, NEAR_DUPLICATE_IN_PROMPT)  # run in the verdict thread, over every other record
SUBMIT_WAIT_S = 10.0  # the longest a flush waits for room in the queue (the writer's lease heartbeat is 30 s)
_COLS = ("id, idx, status, reasoning, content, finish_reason, completion_tokens, reasoning_tokens, extra_json, model,"
         " system_fingerprint, prompt_json, endpoint, row_json, prompt_idx")
_STAT_UPSERT = text(
    "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, example_record_id, updated_at)"
    " VALUES (:r, :c, :f, :n, :wf, :wn, :ex, :t) ON CONFLICT (run_id, check_name) DO UPDATE SET"
    " n_fail = check_stat.n_fail + excluded.n_fail, n_total = check_stat.n_total + excluded.n_total,"
    " win_fail = excluded.win_fail, win_total = excluded.win_total,"
    " example_record_id = COALESCE(excluded.example_record_id, check_stat.example_record_id),"
    " updated_at = excluded.updated_at RETURNING n_fail, n_total, example_record_id")


def load_records(conn: Connection, ids: list[int]) -> list[tuple[RecordView, dict[str, Any]]]:
    """The ok records among ids, as views plus their dataset row's fields (one indexed query)."""
    out = []
    for i in range(0, len(ids), 500):
        chunk = [int(x) for x in ids[i:i + 500]]
        for r in conn.execute(text(f"SELECT {_COLS} FROM record WHERE id IN ({', '.join(map(str, chunk))})"
                                   " AND status = 'ok' ORDER BY id")).mappings():
            out.append((view_from_row(r), vd.row_fields(r["row_json"])))
    return out


class ExtendedRunner:
    """The extended checks of one run in one process: bounded queue, check processes, verdict writer."""

    def __init__(self, engine: Engine, run_id: int, run_name: str, settings: CheckSettings, *,
                 notifier: Any = None, live: bool = True) -> None:
        self.engine = engine
        self.run_id = run_id
        self.settings = settings
        self.live = live  # False (recheck): totals are recounted at the end instead of added per write
        self.names = settings.extended_names()
        self.rules: dict[str, Rule] = rules_for(self.names, settings.rules)
        # the checks the check processes run (check_pool.pool_checks); near_duplicate runs in the verdict thread, and
        # a check whose verdicts come from elsewhere (add_verdicts: a judge) has its rule and rates here only
        pool_names = [v.check_name for v in settings.verifiers] + [u.check_name for u in settings.user]
        pool_names += [r.check_name for r in settings.rule] + (["language"] if settings.language.enabled else [])
        budget = pool_checks_budget(settings)
        n_proc = settings.extended.pool_processes if pool_names else 0
        self.procs = [CheckProcess(settings, pool_names, budget) for _ in range(n_proc)]
        self.neardup: Any = None
        nd = settings.near_duplicate
        if nd.enabled or nd.within_prompt:
            from .neardup import NearDuplicates  # noqa: PLC0415 - datasketch loads only when the check is on

            against = None
            if nd.enabled and nd.against:  # DedupInputError (a ChecksConfigError): the run is refused, exit 2
                from . import dedup_index  # noqa: PLC0415

                against = dedup_index.load(str(engine.url), nd)
            self.neardup = NearDuplicates(nd, against, nd.against or "")
        self.q: queue.Queue[int] = queue.Queue(maxsize=settings.extended.queue_max)
        self.done: queue.SimpleQueue[tuple[int, RecordView, list[Result]]] = queue.SimpleQueue()
        self.outside: queue.SimpleQueue[list[vd.NewVerdict]] = queue.SimpleQueue()  # add_verdicts()
        self.keeper = AlarmKeeper(run_id, run_name, notifier, settings.webhook.dashboard_url)
        self.windows: dict[str, deque[bool]] = {n: deque(maxlen=self.rules[n].window) for n in self.names}
        self.run_stats: dict[str, tuple[int, int, int | None]] = {}
        self.details: dict[str, dict[str, Any]] = {}
        self.counts = {"submitted": 0, "checked": 0, "verdicts": 0, "errors": 0, "waits": 0, "unqueued": 0}
        self.waited_s = 0.0
        self._stop_taking = threading.Event()  # dispatchers take no new record (grace over)
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._paused = False
        self.started_at = time.time()
        self._reloaded = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._writer: threading.Thread | None = None
        self._load()

    # -- life -------------------------------------------------------------------------------------

    def _load(self) -> None:
        with self.engine.connect() as conn:
            if self.names:
                for name, n_fail, n_total, ex in conn.execute(
                    text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
                    {"r": self.run_id},
                ):
                    if name in self.windows:
                        self.run_stats[name] = (n_fail, n_total, ex)
                for name in self.names:  # rolling windows from the latest verdicts (a resumed worker)
                    rows = conn.execute(
                        text("SELECT state FROM check_verdict WHERE run_id = :r AND check_name = :c AND state IN"
                             " ('pass', 'fail') ORDER BY id DESC LIMIT :n"),
                        {"r": self.run_id, "c": name, "n": self.rules[name].window}).all()
                    self.windows[name].extend(r[0] == "fail" for r in reversed(rows))
            self.keeper.load(conn)
            conn.rollback()

    def start(self, backlog: bool = True) -> ExtendedRunner:
        if self.procs:
            for i, p in enumerate(self.procs):
                t = threading.Thread(target=self._dispatch, args=(p,), name=f"synthwatch-checks-{i}", daemon=True)
                self._threads.append(t)
        else:  # near_duplicate only: a dispatcher without a process reads the records
            self._threads.append(threading.Thread(target=self._dispatch, args=(None,), name="synthwatch-checks-0",
                                                  daemon=True))
        self._writer = threading.Thread(target=self._write_loop, name="synthwatch-verdicts", daemon=True)
        for t in (*self._threads, self._writer):
            t.start()
        if backlog:
            threading.Thread(target=self._backlog, name="synthwatch-checks-backlog", daemon=True).start()
        return self

    def _backlog(self) -> None:
        """Records of the run finished before this start without their verdicts (a worker stopped before its
        checks drained): queued again, once."""
        try:
            with self.engine.connect() as conn:
                ids = vd.pending_ids(conn, self.run_id, self.names, limit=self.settings.extended.queue_max)
                conn.rollback()
            if ids:
                log.info("run %d: %d records wait for their checks; checking them", self.run_id, len(ids))
                self.submit(ids)
        except Exception:
            log.exception("run %d: reading the records that wait for their checks failed", self.run_id)

    @property
    def alive(self) -> bool:
        return self._writer is not None and self._writer.is_alive() and not self._closing.is_set()

    def submit(self, ids: list[int], max_wait_s: float | None = None) -> int:
        """Queue records for their checks; when the queue is full, wait (backpressure: the writer, and so the
        worker's claims, slow down to the checks' pace). Nothing is dropped: a record not queued within
        max_wait_s (the writer must keep its heartbeat) or after the checks stopped stays pending, counted in
        ``unqueued`` and logged; the next start of the run or a recheck checks it. Returns how many were queued."""
        deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
        queued = 0
        for i, rid in enumerate(ids):
            try:
                self.q.put_nowait(rid)
            except queue.Full:
                t0 = time.monotonic()
                self.counts["waits"] += 1
                if self.counts["waits"] in (1, 10, 100) or self.counts["waits"] % 1000 == 0:
                    log.warning("run %d: the extended checks are behind (%d records queued): the writer waits",
                                self.run_id, self.q.qsize())
                ok = False
                while self.alive and (deadline is None or time.monotonic() < deadline):
                    try:
                        self.q.put(rid, timeout=0.5)
                        ok = True
                        break
                    except queue.Full:
                        continue
                self.waited_s += time.monotonic() - t0
                if not ok:
                    left = len(ids) - i
                    self.counts["unqueued"] += left
                    log.warning("run %d: %d records not queued for their extended checks (the checks are %s): they "
                                "stay pending until the run's next start or `%s`", self.run_id, left,
                                "stopped" if not self.alive else "behind", hint("checks", "--pending", run=str(self.run_id)))
                    return queued
            queued += 1
            self.counts["submitted"] += 1
        return queued

    def close(self, grace_s: float | None = None) -> None:
        """Drain the queue for at most grace_s (default: the setting), then stop; the rest stays pending."""
        grace = self.settings.extended.drain_grace_s if grace_s is None else grace_s
        deadline = time.monotonic() + grace
        while self.q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop_taking.set()
        for t in self._threads:
            t.join(max(1.0, deadline - time.monotonic()) + 5)
        self._closing.set()
        if self._writer is not None:
            self._writer.join(30)
        for p in self.procs:
            p.close()
        left = self.q.qsize()
        if left:
            log.warning("run %d: %d records left without their extended checks (pending): the next start of the "
                        "run or `%s` checks them", self.run_id, left, hint("checks", "--pending", run=str(self.run_id)))

    def drain(self) -> None:
        """Wait until every queued record has its verdicts written (recheck)."""
        self.q.join()

    def add_verdicts(self, verdicts: list[vd.NewVerdict]) -> None:
        """Verdicts a check computed outside the check processes (a judge model with its own concurrency): the
        verdict thread appends them and counts them in the rates, windows, alarms and auto-pause of their check
        (its name must be one of the run's extended checks, CheckSettings.extended_names, to have a rule)."""
        if verdicts:
            self.outside.put(list(verdicts))

    def take_paused(self) -> bool:
        with self._lock:
            paused, self._paused = self._paused, False
        return paused

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "queued": self.q.qsize(), "waited_s": round(self.waited_s, 3),
                "restarts": sum(p.restarts for p in self.procs)}

    # -- threads ----------------------------------------------------------------------------------

    def _take(self) -> list[int]:
        try:
            ids = [self.q.get(timeout=0.2)]
        except queue.Empty:
            return []
        while len(ids) < BATCH:
            try:
                ids.append(self.q.get_nowait())
            except queue.Empty:
                break
        return ids

    def _dispatch(self, proc: CheckProcess | None) -> None:
        if proc is not None and proc.conn is None:  # (unless warm_up started it)
            proc.start()  # now, not at the first record: the interpreter and the checks take a second or more
        while not self._stop_taking.is_set():
            ids = self._take()
            if not ids:
                continue
            try:
                with self.engine.connect() as conn:
                    recs = load_records(conn, ids)
                    conn.rollback()
                if proc is None:
                    for v, _row in recs:
                        self.done.put((v.record_id, v, []))
                else:
                    views = {v.record_id: v for v, _row in recs}
                    for rid, results in proc.run([(v.record_id, view_args(v), row) for v, row in recs]):
                        self.done.put((rid, views[rid], results))
            except Exception:
                log.exception("run %d: extended checks failed on a batch; its records stay pending", self.run_id)
            finally:
                self.done.put((-len(ids), RecordView(0, 0, "done"), []))  # marks the batch's queue slots done

    def _write_loop(self) -> None:
        buf: list[vd.NewVerdict] = []
        finished = 0
        last = time.monotonic()
        while True:
            stopping = self._closing.is_set()
            try:
                rid, view, results = self.done.get(timeout=0.1)
            except queue.Empty:
                rid = 0
            while True:  # verdicts computed elsewhere (a judge): rates, windows and alarms as for the others
                try:
                    buf.extend(self.outside.get_nowait())
                except queue.Empty:
                    break
            if rid < 0:
                finished += -rid
            elif rid > 0:
                try:
                    buf.extend(self._verdicts(rid, view, results))
                except Exception:
                    log.exception("run %d: the verdicts of record %d could not be built", self.run_id, rid)
            if buf and (len(buf) >= 500 or time.monotonic() - last >= WRITE_EVERY_S or stopping or rid == 0):
                try:
                    self._write(buf)
                except Exception:
                    log.exception("run %d: writing %d verdicts failed; their records stay pending", self.run_id,
                                  len(buf))
                buf = []
                last = time.monotonic()
            if finished and not buf:
                for _ in range(finished):
                    self.q.task_done()
                finished = 0
            if stopping and rid == 0 and not buf:
                return

    def _verdicts(self, rid: int, view: RecordView, results: list[Result]) -> list[vd.NewVerdict]:
        out = [vd.NewVerdict(self.run_id, rid, name, vd.Verdict(state, score, label, reason), ms)
               for name, state, score, label, reason, ms in results]
        if self.neardup is not None:
            t0 = time.perf_counter()
            try:
                got = self.neardup.check(view)
            except Exception as exc:
                # that check's recorded error on this record: the record's other verdicts are still written
                log.exception("run %d: near-duplicate check failed on record %d", self.run_id, rid)
                err = vd.Verdict("error", None, None, f"the near-duplicate check failed ({exc.__class__.__name__})")
                got = dict.fromkeys([n for n in self.names if n in NEAR_DUPLICATES], err)
            ms = (time.perf_counter() - t0) * 1000 / max(1, len(got))
            out.extend(vd.NewVerdict(self.run_id, rid, name, verdict, ms) for name, verdict in got.items())
        return out

    def _write(self, buf: list[vd.NewVerdict]) -> None:
        t = time.time()
        deltas: dict[str, list[Any]] = {}
        new_fail: dict[str, float] = {}
        for v in buf:
            if v.verdict.state not in ("pass", "fail"):
                self.counts["errors"] += v.verdict.state == "error"
                continue
            failed = v.verdict.state == "fail"
            d = deltas.setdefault(v.check_name, [0, 0, None])
            d[1] += 1
            if failed:
                d[0] += 1
                d[2] = v.record_id
                new_fail[v.check_name] = t
                self.details[v.check_name] = {"record_id": v.record_id, "why": v.verdict.reason or ""}
            if self.live and v.check_name in self.windows:
                self.windows[v.check_name].append(failed)
        with self.engine.connect() as conn, store.write_begin(conn):
            if self.live and time.monotonic() - self._reloaded >= RELOAD_S:
                self._reload(conn)
            vd.append(conn, buf, now=t)
            # a check whose verdicts are mostly errors is broken: an alarm of its own (#35)
            detection.error_share_alarms(conn, self.run_id, {v.check_name for v in buf},
                                         self.settings.error_share_threshold, t)
            if self.live and deltas:
                for name, (f, n, ex) in deltas.items():
                    w = self.windows.get(name) or deque()
                    row = conn.execute(_STAT_UPSERT, {"r": self.run_id, "c": name, "f": f, "n": n,
                                                      "wf": sum(w), "wn": len(w), "ex": ex, "t": t}).first()
                    if row is not None:
                        self.run_stats[name] = (row[0], row[1], row[2])
                self.evaluate(conn, t, set(deltas), new_fail)
        self.counts["verdicts"] += len(buf)
        self.counts["checked"] += len({v.record_id for v in buf})

    def _reload(self, conn: Connection) -> None:
        """A rule changed while the run goes (the checks page, the API, `synthwatch checks --config`): its new
        threshold, window or auto-pause applies from the next verdicts, as for a built-in check. Which checks run
        is fixed when the worker starts (a check added later is pending until the next start or --pending)."""
        self._reloaded = time.monotonic()
        cfg = conn.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": self.run_id}).scalar()
        try:
            raw = (orjson.loads(cfg or "{}") or {}).get("checks") or {}
            rules = rules_for(self.names, CheckSettings.model_validate(raw).rules)
        except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
            log.warning("run %d: ignoring invalid check settings: %s", self.run_id, exc)
            return
        if rules == self.rules:
            return
        for name, rule in rules.items():
            if rule.window != self.rules[name].window:
                self.windows[name] = deque(self.windows[name], maxlen=rule.window)
        self.rules = rules
        self.keeper.refresh(conn)
        self.evaluate(conn, time.time(), None, None)
        log.info("run %d: extended check rules reloaded", self.run_id)

    def evaluate(self, conn: Connection, t: float, only: set[str] | None, new_fail: dict[str, float] | None,
                 *, allow_pause: bool = True, clear_sticky: bool = False) -> list[str]:
        windows = {n: (sum(w), len(w)) for n, w in self.windows.items()}
        raised = self.keeper.evaluate(conn, t, self.rules, windows, self.run_stats, self.details, only=only,
                                      new_fail=new_fail, allow_pause=allow_pause, clear_sticky=clear_sticky)
        if self.keeper.paused:
            self.keeper.paused = False
            with self._lock:
                self._paused = True
        return raised

    # -- whole-run counts (recheck) -----------------------------------------------------------------

    def recount(self) -> dict[str, dict[str, int]]:
        """check_stat and windows of the extended checks from the verdicts in force; alarms evaluated again."""
        t = time.time()
        with self.engine.connect() as conn, store.write_begin(conn):
            latest = vd.latest(conn, self.run_id)
            per: dict[str, list[tuple[int, bool]]] = {n: [] for n in self.names}
            for recs in latest.values():
                for name, sv in recs.items():
                    if name in per and sv.state in ("pass", "fail"):
                        per[name].append((sv.id, sv.state == "fail"))
            for name, rows in per.items():
                rows.sort()
                fails = [i for i, f in rows if f]
                ex = None
                if fails:
                    ex = conn.execute(text("SELECT record_id FROM check_verdict WHERE id = :i"),
                                      {"i": fails[-1]}).scalar()
                w = self.windows[name]
                w.clear()
                w.extend(f for _i, f in rows[-self.rules[name].window:])
                self.run_stats[name] = (len(fails), len(rows), ex)
                conn.execute(text("DELETE FROM check_stat WHERE run_id = :r AND check_name = :c"),
                             {"r": self.run_id, "c": name})
                if rows:
                    conn.execute(text("INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail,"
                                      " win_total, example_record_id, updated_at) VALUES (:r, :c, :f, :n, :wf, :wn,"
                                      " :ex, :t)"),
                                 {"r": self.run_id, "c": name, "f": len(fails), "n": len(rows), "wf": sum(w),
                                  "wn": len(w), "ex": ex, "t": t})
            self.evaluate(conn, t, None, None, allow_pause=False, clear_sticky=True)
            counts = vd.state_counts(conn, self.run_id)
        return counts


# ------------------------------------------------------------------------------------ the writer hook


class ExtendedHook:
    """WriterHook: hands the ok records of each committed flush to the runner (ids only; the writer thread does
    no extended check)."""

    def __init__(self, runner: ExtendedRunner) -> None:
        self.runner = runner
        self._staged: dict[int, None] = {}

    def on_outcomes(self, outcomes: list[Any]) -> None:
        for o in outcomes:
            if o.status == "ok":
                self._staged[o.record_id] = None

    def on_flush(self, conn: Connection, t: float) -> None:
        return None

    def after_commit(self) -> None:
        if self._staged:
            ids, self._staged = list(self._staged), {}
            self.runner.submit(ids, max_wait_s=SUBMIT_WAIT_S)

    def pause_due(self) -> bool:
        return False

    def take_paused(self) -> bool:
        return self.runner.take_paused()

    def close(self, grace_s: float | None = None) -> None:
        self.runner.close(grace_s)
        # the drained verdicts may have raised alarms (a check that errors, #35) after the run's end was written:
        # its open items and a completed run's message follow them
        try:
            open_items.sync_run(self.runner.engine, self.runner.run_id, actor="worker")
        except Exception as exc:  # the run's records are written; a failed recount is recounted at the next read
            log.warning("run %d: open items not recounted after the extended checks: %s", self.runner.run_id, exc)


def extended_hook(engine: Engine, run_id: int, run_name: str, settings: CheckSettings,
                  notifier: Any = None) -> ExtendedHook | None:
    """The hook for a run with extended checks (None without any: the writer's path is then unchanged)."""
    if not settings.extended_names():
        return None
    runner = ExtendedRunner(engine, run_id, run_name, settings, notifier=notifier)
    if settings.verifiers and runner.procs:  # one check process started now: its verifiers load before the run
        first = runner.procs[0]
        if not first.start() and first.load_error:
            first.close()
            raise ChecksConfigError(f"{first.load_error} (install it, or remove the verifier from [checks])")
    return ExtendedHook(runner.start())


def recheck(engine: Engine, run_id: int, *, all_records: bool = False) -> dict[str, Any]:
    """Check a run's ok records with its current extended checks (the recompute path): those without a verdict
    in force, or all of them (all_records: a changed check). Appends verdicts, recounts, evaluates alarms."""
    with engine.connect() as conn:
        row = store.run_row(conn, run_id)
        conn.rollback()
    cfg = orjson.loads(row["config_json"] or "{}") or {}
    settings = CheckSettings.model_validate(cfg.get("checks") or {})
    names = settings.extended_names()
    if not names:
        return {"records": 0, "checks": {}}
    t0 = time.time()
    runner = ExtendedRunner(engine, run_id, row["name"], settings, live=False)
    with engine.connect() as conn:
        if all_records:
            ids = [r[0] for r in conn.execute(text("SELECT id FROM record WHERE run_id = :r AND status = 'ok'"
                                                   " ORDER BY id"), {"r": run_id})]
        else:
            ids = vd.pending_ids(conn, run_id, names)
        conn.rollback()
    runner.start(backlog=False)
    runner.submit(ids)
    runner.drain()
    runner.close(0)
    counts = runner.recount()
    return {"records": len(ids), "seconds": round(time.time() - t0, 3), "checks": counts, **runner.stats()}


def errored_ids(session: Any, run_id: int, check_name: str) -> list[int]:
    """Ok records of a run whose verdict in force for a check is 'error' (a check that raised, overran its budget,
    or could not be loaded; a judge that answered no verdict)."""
    return [r[0] for r in session.execute(text(
        "SELECT v.record_id FROM check_verdict v JOIN record r ON r.id = v.record_id AND r.status = 'ok'"
        " WHERE v.run_id = :r AND v.check_name = :c AND v.state = 'error' AND NOT EXISTS (SELECT 1 FROM check_verdict"
        " w WHERE w.record_id = v.record_id AND w.check_name = v.check_name AND w.id > v.id) ORDER BY v.record_id"),
        {"r": run_id, "c": check_name})]


def _only(settings: CheckSettings, name: str) -> CheckSettings:
    """The run's settings with one pool check left (its rule and the run's other settings kept)."""
    return settings.model_copy(update={
        "verifiers": [v for v in settings.verifiers if v.check_name == name],
        "user": [u for u in settings.user if u.check_name == name],
        "rule": [r for r in settings.rule if r.check_name == name],
        "language": settings.language.model_copy(update={"enabled": settings.language.enabled and name == "language"}),
        "near_duplicate": settings.near_duplicate.model_copy(update={"enabled": False, "within_prompt": False}),
    })


def retry_errors(engine: Engine, run_id: int) -> dict[str, Any]:
    """`synthwatch checks RUN --retry-errors` (#35): each extended check runs again on the records whose verdict in
    force is its 'error', and on those only; the new verdict is appended (the error stays in the history). A
    near-duplicate verdict depends on every other record: `--recompute` checks it again, not this."""
    with engine.connect() as conn:
        row = store.run_row(conn, run_id)
        cfg = orjson.loads(row["config_json"] or "{}") or {}
        settings = CheckSettings.model_validate(cfg.get("checks") or {})
        todo = {n: errored_ids(conn, run_id, n) for n in settings.extended_names() if n not in NEAR_DUPLICATES}
        conn.rollback()
    t0 = time.time()
    retried: dict[str, int] = {}
    for name, ids in todo.items():
        if not ids:
            continue
        runner = ExtendedRunner(engine, run_id, row["name"], _only(settings, name), live=False)
        runner.start(backlog=False)
        runner.submit(ids)
        runner.drain()
        runner.close(0)
        runner.recount()
        retried[name] = len(ids)
    with engine.connect() as conn:
        still = {n: len(errored_ids(conn, run_id, n)) for n in retried}
        conn.rollback()
    return {"retried": retried, "still_error": still, "seconds": round(time.time() - t0, 3)}
