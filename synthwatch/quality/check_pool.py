"""The check processes (#30): extended checks run in processes of their own, never in the writer thread.

Why processes, not threads: math-verify's timeouts are signal.alarm based (main thread only), user code may
hold the GIL or never return, and a check that crashes its interpreter must not take the worker with it.

Each :class:`CheckProcess` is one spawned interpreter (``spawn``: the worker has threads, a forked copy of them
could deadlock) serving batches of records over a pipe. In the process, each check of each record runs in the
main thread under its own time budget (``setitimer``; the math verifier keeps math-verify's own alarm), and
anything it raises, even SystemExit, is that check's 'error' verdict on that record. The parent gives each
record a deadline too (the sum of the budgets plus a margin): a process that passes it (a check stuck in C
code, where no signal lands) or dies is killed and started again, the record it was on gets an 'error' verdict
for each of its checks, and the rest of the batch goes to the new process.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import orjson

from ..check_catalog import CheckSettings
from .checks import RecordView
from .user_checks import UserCheckError, coerce, make_rule_check, make_user_check
from .verdicts import Verdict
from .verifiers import make_verifier, warm_up

log = logging.getLogger("synthwatch.checks")

START_TIMEOUT_S = 120.0  # imports, user modules, language models
MARGIN_S = 2.0
RULE_BUDGET_S = 5.0  # a TOML rule's and the language check's time budget per record
VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RecordView))
# one verdict as sent back: (check name, state, score, label, reason, cost_ms)
Result = tuple[str, str, float | None, str | None, str | None, float]


class CheckTimeout(Exception):
    pass


@dataclass(slots=True)
class PoolCheck:
    name: str
    fn: Callable[[RecordView, Mapping[str, Any]], Any]
    timeout_s: float
    own_timer: bool = True  # False: the check times itself out (math-verify's signal.alarm)


def _broken(name: str, why: str) -> Callable[[RecordView, Mapping[str, Any]], Verdict]:
    def check(record: RecordView, row: Mapping[str, Any]) -> Verdict:
        return Verdict("error", reason=why)
    return check


def pool_checks(settings: CheckSettings) -> list[PoolCheck]:
    """The checks that run in the check processes (all extended ones except near_duplicate), in catalogue order.
    A check that cannot be built (a user function that does not import) answers 'error' with the reason."""
    out: list[PoolCheck] = []
    for v in settings.verifiers:
        out.append(PoolCheck(v.check_name, make_verifier(v), v.timeout_s, own_timer=v.kind != "math"))
    for u in settings.user:
        try:
            fn = make_user_check(u)
        except UserCheckError as exc:
            fn = _broken(u.check_name, str(exc))
        out.append(PoolCheck(u.check_name, fn, u.timeout_s))
    for r in settings.rule:
        try:
            fn = make_rule_check(r, settings.language)
        except ValueError as exc:
            fn = _broken(r.check_name, str(exc))
        out.append(PoolCheck(r.check_name, fn, RULE_BUDGET_S))
    if settings.language.enabled:
        from .language import LanguageCheck  # noqa: PLC0415 - lingua loads only where the check is on

        try:
            out.append(PoolCheck("language", LanguageCheck(settings.language), RULE_BUDGET_S))
        except ValueError as exc:
            out.append(PoolCheck("language", _broken("language", str(exc)), RULE_BUDGET_S))
    return out


def pool_checks_budget(settings: CheckSettings) -> float:
    """The time budgets of one record's pool checks, summed (the parent's deadline per record)."""
    return (sum(v.timeout_s for v in settings.verifiers) + sum(u.timeout_s for u in settings.user)
            + RULE_BUDGET_S * len(settings.rule) + (RULE_BUDGET_S if settings.language.enabled else 0.0))


def _alarm(signum: int, frame: Any) -> None:
    raise CheckTimeout


def run_check(c: PoolCheck, view: RecordView, row: Mapping[str, Any]) -> Result:
    """One check on one record: its verdict, or 'error' for anything it raises or a budget it overruns."""
    t0 = time.perf_counter()
    try:
        if c.own_timer:
            signal.setitimer(signal.ITIMER_REAL, c.timeout_s)
        try:
            v = c.fn(view, row)
        finally:
            if c.own_timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if not isinstance(v, Verdict):
            v = coerce(v)
    except CheckTimeout:
        v = Verdict("error", reason=f"over its time budget of {c.timeout_s:g} s")
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included: its verdict
        v = Verdict("error", reason=f"{exc.__class__.__name__}: {exc}"[:500])
    ms = (time.perf_counter() - t0) * 1000
    if v.state != "error" and ms > c.timeout_s * 1000:  # a check that times itself out but still answered late
        v = Verdict("error", reason=f"over its time budget of {c.timeout_s:g} s ({ms / 1000:.1f} s)")
    return (c.name, v.state, v.score, v.label, v.reason, ms)


def view_args(v: RecordView) -> tuple[Any, ...]:
    return tuple(getattr(v, f) for f in VIEW_FIELDS)


def warm_up_verifiers(settings_json: bytes) -> str | None:
    """Each verifier loaded and run once before the first record (outside its budget); what cannot load, said."""
    for v in CheckSettings.model_validate(orjson.loads(settings_json)).verifiers:
        try:
            warm_up(v)
        except BaseException as exc:  # noqa: BLE001 - a library that does not import may raise anything
            return f"verifier {v.check_name} cannot load: {exc.__class__.__name__}: {exc}"[:500]
    return None


def serve(conn: Connection, settings_json: bytes) -> None:
    """The check process's main loop (spawned): ready, then batches until the pipe closes or None arrives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when checks stop, not a terminal's ^C
    signal.signal(signal.SIGALRM, _alarm)
    try:
        checks = pool_checks(CheckSettings.model_validate(orjson.loads(settings_json)))
    except Exception as exc:
        conn.send(("failed", f"{exc.__class__.__name__}: {exc}"[:500]))
        return
    if (why := warm_up_verifiers(settings_json)) is not None:
        conn.send(("unloadable", why))
        return
    conn.send(("ready", [c.name for c in checks]))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        for rid, args, row in msg:
            view = RecordView(*args)
            conn.send(("r", rid, [run_check(c, view, row) for c in checks]))
            signal.signal(signal.SIGALRM, _alarm)  # a check may have installed its own handler


class CheckProcess:
    """One check process, restarted when it dies or overruns a record's deadline."""

    def __init__(self, settings: CheckSettings, names: list[str], budget_s: float) -> None:
        self.settings_json = orjson.dumps(settings.model_dump(mode="json"))
        self.names = names
        self.deadline_s = budget_s + MARGIN_S
        self.proc: Any = None
        self.conn: Connection | None = None
        self.restarts = 0
        self.start_error: str | None = None
        self.load_error: str | None = None  # a verifier that cannot load (the run is refused: extended_hook)
        self.closed = False  # after close(): no restart, no more records (a dispatcher may still be on one)

    def start(self) -> bool:
        if self.closed:
            self.start_error = "the checks were shut down"
            return False
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=serve, args=(child, self.settings_json), name="synthwatch-checks", daemon=True)
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise TimeoutError(f"not ready within {START_TIMEOUT_S:g} s")
            kind, detail = parent.recv()
        except (EOFError, OSError, TimeoutError) as exc:
            kind, detail = "failed", f"{exc.__class__.__name__}: {exc}"
        if kind == "unloadable":
            self.load_error = str(detail)
        if kind != "ready":
            self.start_error = f"the check process did not start: {detail}"
            log.error("%s", self.start_error)
            self.kill()
            return False
        self.start_error = None
        return True

    def kill(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
            self.proc = None

    def close(self) -> None:
        self.closed = True
        if self.conn is not None:
            try:
                self.conn.send(None)
            except OSError:
                pass
        if self.proc is not None:
            self.proc.join(2)
        self.kill()

    def _errors(self, why: str) -> list[Result]:
        return [(n, "error", None, None, why, 0.0) for n in self.names]

    def run(self, items: list[tuple[int, tuple[Any, ...], dict[str, Any]]]) -> Iterator[tuple[int, list[Result]]]:
        """Each item's verdicts, in order; a record whose process died or overran gets 'error' verdicts."""
        todo = list(items)
        while todo and not self.closed:
            if self.conn is None and not self.start():
                if self.closed:
                    return
                for rid, _a, _r in todo:
                    yield rid, self._errors(self.start_error or "the check process did not start")
                return
            conn = self.conn  # close() (another thread) may drop self.conn while this waits on it
            assert conn is not None
            try:
                conn.send(todo)
            except OSError as exc:
                if self.closed:
                    return
                self.kill()
                self.restarts += 1
                rid = todo.pop(0)[0]
                yield rid, self._errors(f"the check process could not take the record ({exc.__class__.__name__})")
                continue
            while todo:
                rid = todo[0][0]
                why = None
                try:
                    if conn.poll(self.deadline_s):
                        kind, got_rid, results = conn.recv()
                        if kind == "r" and got_rid == rid:
                            todo.pop(0)
                            yield rid, results
                            continue
                        why = "the check process answered out of turn"
                    else:
                        why = (f"the checks did not finish within {self.deadline_s:g} s (a check stuck where its own "
                               "time budget cannot stop it); the check process was restarted")
                except (EOFError, OSError):
                    if self.closed:  # shut down under this record: it stays pending, re-checkable
                        return
                    proc = self.proc
                    code = proc.exitcode if proc is not None else None
                    why = f"the check process died (exit code {code}) on this record; it was restarted"
                if self.closed:
                    return
                log.warning("record %d: %s", rid, why)
                self.kill()
                self.restarts += 1
                todo.pop(0)
                yield rid, self._errors(why)
                break
