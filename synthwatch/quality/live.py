"""The checks while a run is live: the writer hook (:class:`ChecksHook`) that checks every stored record in the
worker's writer thread, keeps a rolling window per check in memory, adds whole-run counts to ``check_stat`` in the
writer's transaction, and lets :class:`synthwatch.quality.detection.alarms.AlarmKeeper` raise alarms and auto-pause the run."""

from __future__ import annotations

import functools
import logging
import operator
import time
from collections import Counter
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import BIT, CHECK_NAMES, CheckSettings, Rule
from ..config import ConfigError
from ..settings import get_settings
from ..store import queue as store
from .checks import (
    ChecksConfigError,
    RecordChecker,
    RecordView,
    RunContext,
    check_turns,
    parse_settings,
    view_from_outcome,
)
from .detection import Hysteresis, Window, open_items, other_workers_live, overrides, recent_windows  # noqa: F401  (overrides: registers the guard of config versions)
from .detection.alarms import AlarmKeeper, effective_rules
from .notify import Notifier
from .token_checks import MAX_HELD_CHARS, TokenJob, TokenThread, tokenizer_spec

log = logging.getLogger("synthwatch.checks")
_KIND = operator.itemgetter(1, 2, 3)  # a staged record's (applied, failed, new)

@functools.lru_cache(maxsize=64)
def _stat_upsert(n_rows: int) -> Any:
    """Add a flush's counts to check_stat for n_rows checks at once; returns each check's running totals."""
    values = ", ".join(f"(:r, :c{i}, :f{i}, :n{i}, :wf{i}, :wn{i}, :ex{i}, :t)" for i in range(n_rows))
    return text(
        "INSERT INTO check_stat (run_id, check_name, n_fail, n_total, win_fail, win_total, example_record_id,"
        f" updated_at) VALUES {values} ON CONFLICT (run_id, check_name) DO UPDATE SET"
        " n_fail = check_stat.n_fail + excluded.n_fail, n_total = check_stat.n_total + excluded.n_total,"
        " win_fail = excluded.win_fail, win_total = excluded.win_total,"
        " example_record_id = COALESCE(excluded.example_record_id, check_stat.example_record_id),"
        " updated_at = excluded.updated_at RETURNING check_name, n_fail, n_total, example_record_id"
    )


# ------------------------------------------------------------------------------------ the writer hook


class ChecksHook:
    """WriterHook: per-record checks before the write, rates + alarms inside the write transaction."""

    RELOAD_S = 2.0

    def __init__(self, engine: Engine, ctx: RunContext, *, notifier: Notifier | None = None,
                 load: bool = True) -> None:
        self.engine = engine
        self.run_id = ctx.run_id
        self.ctx = ctx
        self.checker = RecordChecker(ctx)
        self.rules: dict[str, Rule] = effective_rules(ctx.settings.rules)
        self.windows: dict[str, Window] = {n: Window(self.rules[n].window) for n in CHECK_NAMES}
        self.run_stats: dict[str, tuple[int, int, int | None]] = {}
        self.details: dict[str, dict[str, Any]] = {}
        self.mismatch_fields: set[str] = set()
        self.notifier = notifier if notifier is not None else Notifier(
            ctx.notify_url, timeout_s=ctx.settings.webhook.timeout_s)
        self.keeper = AlarmKeeper(ctx.run_id, ctx.name, self.notifier, ctx.settings.webhook.dashboard_url)
        self.keeper.hysteresis = Hysteresis.of(ctx.settings)
        self.worker_id: int | None = None  # set by the worker's writer when it knows it (other workers' evidence)
        self.tokens: TokenThread | None = None
        self.template_done = False
        self.ok_seen = 0
        self.check_errors = 0
        # record_id -> (record_id, applied, failed, new): checked, not written yet. The writer checks finished
        # records as they arrive (so an auto-pause lands before its worker's next claim) and again at the flush;
        # a record is staged once.
        self._staged: dict[int, tuple[int, int, int, bool]] = {}
        self._new_fail: dict[str, float] = {}  # check -> latest finish time of a failing staged record
        self._seen_seq: tuple[int, int] | None = None  # (config_version, repair_seq) the state was loaded at
        self._results: dict[int, tuple[int, int, dict[str, Any]]] = {}  # recent record -> result (retries)
        self._sample_details: dict[int, dict[str, Any]] = {}
        self._raw_checks = orjson.dumps(ctx.settings.model_dump(mode="json"))
        self._last_reload = time.monotonic()
        self._reevaluate_all = True
        self._items_synced = 0.0
        self._items_every_s = open_items.SYNC_EVERY_S  # longer for a large run (_sync_items)
        self._items_open = True  # until the first sync says otherwise (a resumed run may have some)
        self._early: dict[int, int] = {}  # record -> bits of checks it failed while in flight (observe_early)
        if load:
            self._load()

    # -- state on start / resume ----------------------------------------------------------------

    def _load(self) -> None:
        with self.engine.connect() as conn:
            for name, n_fail, n_total, ex in conn.execute(
                text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
                {"r": self.run_id},
            ):
                self.run_stats[name] = (n_fail, n_total, ex)
            self.template_done = self.run_stats.get("template_drops_reasoning", (0, 0, None))[1] > 0
            for ep, model, fp in conn.execute(
                text("SELECT endpoint, model, system_fingerprint FROM record WHERE run_id = :r AND status = 'ok'"
                     " AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 200"), {"r": self.run_id},
            ):
                if model is not None or fp is not None:
                    self.checker.baseline.setdefault(ep or "", (model, fp))
            n = self.ctx.settings.duplicate_resume_records
            if n and "duplicate_output" not in self.ctx.settings.disabled:
                for rid, r, c in conn.execute(
                    text("SELECT id, reasoning, content FROM record WHERE run_id = :r AND status = 'ok'"
                         " AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT :n"), {"r": self.run_id, "n": n},
                ):
                    self.checker.remember(rid, r or "", c or "")
            # the evidence belongs to the run: the windows start from its latest finished records, whichever
            # worker process wrote them (#35), never from nothing
            self.windows = recent_windows(conn, self.run_id, self.checker, self.rules)
            self.keeper.load(conn)
            # the version this state was loaded at: a newer one (a settings change, a repair) is adopted at the next
            # flush, even one made before the first reload
            seq = conn.execute(text("SELECT config_version, repair_seq FROM run WHERE id = :r"),
                               {"r": self.run_id}).first()
            if seq is not None:
                self._seen_seq = (int(seq[0] or 1), int(seq[1] or 0))
            conn.rollback()
        if self.ctx.tokenizer and self.ctx.tokenizer.get("name_or_path"):
            # a text long enough to be spooled (workers/long_texts.py) is not held again by a token job
            self.tokens = TokenThread(tokenizer_spec(self.ctx),
                                      max_job_chars=get_settings().long_text_spool_chars or MAX_HELD_CHARS)

    # -- WriterHook ----------------------------------------------------------------------------

    def on_outcomes(self, outcomes: list[Any]) -> None:
        staged = self._staged
        early = self._early
        for o in outcomes:
            if o.status == "pending" or o.record_id in staged:
                if early and o.status == "pending":
                    early.pop(o.record_id, None)
                continue
            prev = self._results.get(o.record_id)
            if prev is not None:  # the same outcome again: the previous write transaction failed
                applied, failed, det = prev
                o.check_flags = failed
                o.check_json = orjson.dumps(det).decode() if det else None
                staged[o.record_id] = (o.record_id, applied, failed, False)
                continue
            v = None
            try:
                v = view_from_outcome(o)
                applied, failed, det = check_turns(self.checker, v, o.turns) if o.turns \
                    else self.checker.check(v)
                check_json = orjson.dumps(det).decode() if det else None
            except Exception as exc:  # a checks bug must not stop data collection: flag the record instead
                self.check_errors += 1
                if self.check_errors <= 5:
                    log.exception("checks failed on record %d", o.record_id)
                applied, failed, det = 0, 0, {"check_error": f"{exc.__class__.__name__}: {exc}"[:500]}
                check_json = orjson.dumps(det).decode()
            o.check_flags = failed
            o.check_json = check_json
            self._results[o.record_id] = (applied, failed, det)
            if early:  # what it failed in flight is counted already (observe_early): not a second time
                applied &= ~early.pop(o.record_id, 0)
            staged[o.record_id] = (o.record_id, applied, failed, True)
            if failed:
                fin = o.finished_at or time.time()
                for name in CHECK_NAMES:
                    if failed & BIT[name] and fin > self._new_fail.get(name, 0.0):
                        self._new_fail[name] = fin
            if v is not None and v.status == "ok":
                self.ok_seen += 1
                self._maybe_tokenize(v, det)
        if len(self._results) > 20_000:  # keep only what a retried flush can ask for again
            for k in list(self._results)[: len(self._results) - 10_000]:
                del self._results[k]

    def _maybe_tokenize(self, v: RecordView, det: dict[str, Any]) -> None:
        if self.tokens is None:
            return
        template = not self.template_done and bool(v.reasoning.strip()) \
            and "template_drops_reasoning" not in self.ctx.settings.disabled
        count = ("token_count_mismatch" not in self.ctx.settings.disabled and v.completion_tokens is not None
                 and self.ok_seen % self.ctx.settings.token_sample_every == 0)
        if not (template or count):
            return
        job = TokenJob(v.record_id, v.prompt_messages(), v.reasoning, v.content, v.completion_tokens, template, count)
        if self.tokens.submit(job):
            if template:
                self.template_done = True
            if len(self._sample_details) < 1000:
                self._sample_details[v.record_id] = det

    def pause_due(self) -> bool:
        """Would the records checked but not yet written pause the run? (windows as they would be after them)"""
        if not self._new_fail:
            return False
        windows = {n: w.counts() for n, w in self.windows.items()}
        for _rid, applied, failed, new in self._staged.values():
            if not new:
                continue
            for name in self._new_fail:
                b = BIT[name]
                if applied & b:
                    f, n = windows[name]
                    w = self.windows[name]
                    full = n >= w.size
                    windows[name] = (f + bool(failed & b), n if full else n + 1)
        return self.keeper.would_pause(self.rules, windows, self._new_fail)

    def take_paused(self) -> bool:
        """True once after a flush in which an alarm paused the run."""
        paused, self.keeper.paused = self.keeper.paused, False
        return paused

    def on_flush(self, conn: Connection, t: float) -> None:
        deltas: dict[str, list[Any]] = {}  # check -> [fail, total, example]
        staged = list(self._staged.values())
        # A flush's records share a handful of (applied, failed, new) combinations: counted once per record in C,
        # each check's counts are then sums over the combinations, not a pass over the records per check (two
        # generator passes per check were ~24 Python steps per record, 7 % of the writer thread's CPU; #25)
        kinds = Counter(map(_KIND, staged))
        any_applied = any_failed = 0
        for applied, failed, _new in kinds:
            any_applied |= applied
            any_failed |= failed
        # per check rather than per record and check: a flush holds hundreds of records, a dozen checks apply
        for name in CHECK_NAMES:
            b = BIT[name]
            if not any_applied & b:
                continue
            if not any_failed & b:  # the usual case: every record passed this check
                n_applied = n_new = 0
                for (applied, _failed, new), count in kinds.items():
                    if applied & b:
                        n_applied += count
                        if new:
                            n_new += count
                deltas[name] = [0, n_applied, None]
                self.windows[name].extend([False] * n_new)
                continue
            rows = [(s[0], bool(s[2] & b), s[3]) for s in staged if s[1] & b]
            fails = [rid for rid, f, _new in rows if f]
            deltas[name] = [len(fails), len(rows), fails[-1] if fails else None]
            self.windows[name].extend([f for _rid, f, new in rows if new])
        if any(w.provisional for w in self.windows.values()):  # in-flight evidence replaced by the final verdicts
            ids = [s[0] for s in staged]
            for w in self.windows.values():
                w.settle(ids)
        for rid, _applied, failed, new in staged:
            if new and failed:
                res = self._results.get(rid)
                if res is None:  # a verdict from a stream in flight: its evidence is in details already
                    continue
                det = res[2]
                for name, d in det.items():
                    if name not in BIT:
                        continue
                    self.details[name] = {**d, "record_id": rid}
                    if name == "field_mismatch":
                        self.mismatch_fields.update(d.get("fields") or ())
        if self.tokens is not None:
            self._apply_token_results(conn, deltas)
        if time.monotonic() - self._last_reload >= self.RELOAD_S or self._repaired(conn):
            self._last_reload = time.monotonic()
            self._reload(conn)
        touched = set(deltas)
        if deltas:
            # one multi-row statement per flush (RETURNING does not combine with executemany everywhere,
            # and a statement per check was a dozen round trips per flush)
            params: dict[str, Any] = {"r": self.run_id, "t": t}
            for i, (n, d) in enumerate(deltas.items()):
                params.update({f"c{i}": n, f"f{i}": d[0], f"n{i}": d[1], f"wf{i}": self.windows[n].fail,
                               f"wn{i}": self.windows[n].total, f"ex{i}": d[2]})
            for name, n_fail, n_total, ex in conn.execute(_stat_upsert(len(deltas)), params):
                self.run_stats[name] = (n_fail, n_total, ex)
        raised: list[str] = []
        if touched or self._reevaluate_all:
            raised = self._evaluate(conn, t, None if self._reevaluate_all else touched)
            self._reevaluate_all = False
        self._sync_items(conn, t, bool(raised))
        self._staged = {}
        self._new_fail = {}

    def observe_early(self, conn: Connection, t: float, verdicts: list[Any]) -> None:
        """Failures seen on streams in flight (synthwatch.quality.inflight.deliver, in this writer's transaction):
        each is counted as that record's verdict for that check, observed early, and evaluated at once with the
        same rules, windows and hysteresis; its evidence (record, delta, excerpt) is the alarm's details. The record
        is not counted again for that check when it finishes; a record cancelled back to pending keeps the
        count (it was seen)."""
        en = self.checker.enabled
        staged = self._staged
        for v in verdicts:
            b = BIT.get(v.check, 0)
            if not b & en or (v.check == "empty_reasoning" and not self.ctx.expects):
                continue
            if self._early.get(v.record_id, 0) & b or v.record_id in self._results:
                continue  # counted already (or finished meanwhile: its own verdict counts)
            self._early[v.record_id] = self._early.get(v.record_id, 0) | b
            staged[-(v.record_id * 64 + CHECK_NAMES.index(v.check))] = (v.record_id, b, b, True)
            self._new_fail[v.check] = t
            self.details[v.check] = v.evidence()
            if v.check == "field_mismatch":
                self.mismatch_fields.update(v.detail.get("fields") or ())
        if len(self._early) > 50_000:
            self._early.clear()
        if staged:
            self.on_flush(conn, t)

    def _apply_token_results(self, conn: Connection, deltas: dict[str, list[Any]]) -> None:
        assert self.tokens is not None
        for rid, name, failed, det in self.tokens.drain():
            d = deltas.setdefault(name, [0, 0, None])
            d[1] += 1
            self.windows[name].add(failed)
            if not failed:
                continue
            d[0] += 1
            d[2] = rid
            self.details[name] = {**det, "record_id": rid}
            merged = dict(self._sample_details.get(rid) or {})
            merged[name] = det
            conn.execute(text("UPDATE record SET check_flags = check_flags | :b, check_json = :j WHERE id = :i"),
                         {"b": BIT[name], "j": orjson.dumps(merged).decode(), "i": rid})
        if len(self._sample_details) >= 1000:
            self._sample_details.clear()

    def _evaluate(self, conn: Connection, t: float, only: set[str] | None) -> list[str]:
        windows = {n: w.counts() for n, w in self.windows.items()}
        details = dict(self.details)
        if "field_mismatch" in details:
            details["field_mismatch"] = {**details["field_mismatch"], "fields": sorted(self.mismatch_fields),
                                         "mode": self.ctx.mode}
        return self.keeper.evaluate(conn, t, self.rules, windows, self.run_stats, details, only=only,
                                    new_fail=self._new_fail)

    def _sync_items(self, conn: Connection, t: float, now: bool) -> None:
        """Open items (quality/detection/open_items.py): opened as soon as an alarm is raised, recounted from the records every
        SYNC_EVERY_S (longer on a large run: open_items.sync_wait_s) while an alarm or an item is open (a re-run's
        records may close one)."""
        if not now and not (self.keeper.active or self._items_open):
            return
        m = time.monotonic()
        if not now and m - self._items_synced < self._items_every_s:
            return
        self._items_synced = m
        open_items.sync(conn, self.run_id, t=t)
        self._items_open = open_items.any_open(conn, self.run_id)
        # a recount's cost grows with the run: the next one waits longer when this one was slow (an alarm raised
        # still syncs at once, ``now``)
        self._items_every_s = open_items.sync_wait_s(time.monotonic() - m)

    def _repaired(self, conn: Connection) -> bool:
        """A repair or a new config version since the state was loaded: the windows are re-read before these records
        are evaluated (alarms are read from the database at each evaluation, so stale windows would re-raise one a
        repair just cleared)."""
        if self._seen_seq is None:
            return False
        row = conn.execute(text("SELECT config_version, repair_seq FROM run WHERE id = :r"), {"r": self.run_id}).first()
        return row is not None and (int(row[0] or 1), int(row[1] or 0)) != self._seen_seq

    def _reload(self, conn: Connection) -> None:
        """Pick up what changed while running: check settings, a new config version (reading settings), and
        repairs (re-derive / re-run rewrote check results: whole-run counts, windows and alarms are re-read)."""
        row = conn.execute(text("SELECT config_json, config_version, repair_seq FROM run WHERE id = :r"),
                           {"r": self.run_id}).first()
        if row is None:
            return
        if other_workers_live(conn, self.run_id, self.worker_id):  # one view: the windows over every worker's records
            old, self.windows = self.windows, recent_windows(conn, self.run_id, self.checker, self.rules)
            for name, w in self.windows.items():
                w.provisional = old[name].provisional
            self._reevaluate_all = True
        seq = (int(row[1] or 1), int(row[2] or 0))
        if self._seen_seq is None:
            self._seen_seq = seq
        elif seq != self._seen_seq:
            self._seen_seq = seq
            try:
                cfg = orjson.loads(row[0]) or {}
                fresh = RunContext.from_config(self.run_id, self.ctx.name, cfg)
            except (orjson.JSONDecodeError, ConfigError) as exc:
                log.warning("ignoring invalid config of run %d: %s", self.run_id, exc)
            else:
                self.ctx.mode, self.ctx.expects = fresh.mode, fresh.expects
                self.ctx.think_open, self.ctx.think_close = fresh.think_open, fresh.think_close
                self.checker.set_context(self.ctx)
            self.reload_state(conn)
        try:
            raw = (orjson.loads(row[0]) or {}).get("checks") or {}
            settings = parse_settings(raw)
        except (orjson.JSONDecodeError, ChecksConfigError, AttributeError) as exc:
            log.warning("ignoring invalid check settings of run %d: %s", self.run_id, exc)
            return
        dumped = orjson.dumps(settings.model_dump(mode="json"))
        if dumped == self._raw_checks:
            return
        self._raw_checks = dumped
        self.apply_settings(settings)

    def reload_state(self, conn: Connection) -> None:
        """Whole-run counts, rolling windows and active alarms as stored (after a repair changed them)."""
        self.run_stats = {name: (n_fail, n_total, ex) for name, n_fail, n_total, ex in conn.execute(
            text("SELECT check_name, n_fail, n_total, example_record_id FROM check_stat WHERE run_id = :r"),
            {"r": self.run_id})}
        self.windows = recent_windows(conn, self.run_id, self.checker, self.rules)
        self.details = {}
        self.mismatch_fields = set()
        self.keeper.load(conn)
        self._reevaluate_all = True

    def apply_settings(self, settings: CheckSettings) -> None:
        self.ctx.settings = settings
        self.checker.set_context(self.ctx)
        self.rules = effective_rules(settings.rules)
        self.keeper.hysteresis = Hysteresis.of(settings)
        for name in CHECK_NAMES:
            w = self.windows[name]
            if w.size != self.rules[name].window:
                self.windows[name] = Window(self.rules[name].window, list(w.buf))
        self._reevaluate_all = True
        log.info("run %d: check settings reloaded", self.run_id)


def writer_hooks(engine: Engine, run_id: int, config: Any) -> list[Any]:
    """The hooks a worker (or `synthwatch watch`) passes to its writer for this run.

    config: a RunConfig, its snapshot dict, or None (the run's stored config). Raises ChecksConfigError
    (a ConfigError) for a bad `[checks]` table."""
    if config is None:  # use what the run stored
        with engine.connect() as conn:
            row = store.run_row(conn, run_id)
            conn.rollback()
        cfg = orjson.loads(row["config_json"] or "{}") or {}
        cfg.setdefault("name", row["name"])
    else:
        cfg = config if isinstance(config, dict) else config.snapshot()
    name = cfg.get("name") or str(run_id)
    ctx = RunContext.from_config(run_id, name, cfg)
    hooks: list[Any] = [ChecksHook(engine, ctx)]
    if ctx.settings.extended_names():  # verifiers, user checks, rules...: off the writer thread (#30)
        from .extended import extended_hook  # noqa: PLC0415 - the check processes start only when a run has them

        ext = extended_hook(engine, run_id, name, ctx.settings, notifier=hooks[0].notifier)
        if ext is not None:
            hooks.append(ext)
    return hooks


