"""Raw SQL shared by the worker, the CLI and the web app: runs, the prompt queue, controls.

All statements bind their values. The queue lives in the ``record`` table: prompts are loaded
as ``pending``; a claim flips a batch to ``in_flight`` under a lease inside one write
transaction that also checks the cap, so the cap holds exactly even with several workers.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from ..check_catalog import DEFAULT_RULES
from ..config import RunConfig
from ..hints import command as hint
from . import rows
from .statuses import RECORD_STATUSES

CONTROL_ACTIONS = ("pause", "resume", "stop", "stop_now", "cap", "concurrency")


class NotFound(Exception):
    pass


class ControlError(ValueError):
    pass


class AlarmOpen(ControlError):
    """A plain resume while a pausing alarm is open and not snoozed: the person must acknowledge it (for how many
    records or minutes) in the same action, or the claim would pause the run again at once."""

    def __init__(self, message: str, alarms: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.alarms = alarms


def now() -> float:
    return time.time()


def is_pg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def write_begin(conn: Connection) -> Any:
    """Begin a write transaction; on SQLite take the write lock up front (no upgrade deadlocks)."""
    if conn.dialect.name == "sqlite":
        return conn.execution_options(sqlite_begin="BEGIN IMMEDIATE").begin()
    return conn.begin()


def lock_run(conn: Connection, run_id: int) -> None:
    """Take the run's row lock first in a write transaction (PostgreSQL).

    Every worker's transaction touches record rows and the run row (its counters). Taking the run
    row first gives all of them one lock order, so two workers can never deadlock; SQLite's BEGIN
    IMMEDIATE already serialises writers."""
    if is_pg(conn):
        conn.execute(text("SELECT id FROM run WHERE id = :r FOR UPDATE"), {"r": run_id})


@dataclass(slots=True)
class Claimed:
    id: int
    idx: int
    messages: list[dict[str, Any]]
    attempts: int
    attempts_json: str | None
    rerun: bool = False  # queued again by a re-run (synthwatch.repair.actions)
    n_turns: int = 1  # turns the model writes (synthwatch.capture.turns)
    turns_json: str | None = None  # the finished turns so far: a resumed conversation goes on from the next
    sample_index: int = 0  # which of its prompt's samples (samples_per_prompt): picks the request's seed
    prompt_idx: int = -1  # the prompt's row in the dataset: a prompt's samples share it (one request with n = k)


# ---------------------------------------------------------------- runs


def run_row(conn: Connection, run_ref: int | str) -> dict[str, Any]:
    if isinstance(run_ref, int) or (isinstance(run_ref, str) and run_ref.isdigit()):
        row = conn.execute(text("SELECT * FROM run WHERE id = :r"), {"r": int(run_ref)}).mappings().first()
        if row is None and isinstance(run_ref, str):
            row = conn.execute(text("SELECT * FROM run WHERE name = :r"), {"r": run_ref}).mappings().first()
    else:
        row = conn.execute(text("SELECT * FROM run WHERE name = :r"), {"r": run_ref}).mappings().first()
    if row is None:
        raise NotFound(f"no run {run_ref!r} in this database")
    return dict(row)


def find_run_id(conn: Connection, name: str) -> int | None:
    return conn.execute(text("SELECT id FROM run WHERE name = :n"), {"n": name}).scalar()


def create_run(conn: Connection, name: str, config: RunConfig | None, *, kind: str = "generate",
               snapshot: dict[str, Any] | None = None) -> int:
    t = now()
    snap = snapshot if snapshot is not None else (config.snapshot() if config else {})
    params = {
        "name": name,
        "kind": kind,
        "cap": config.cap if config else None,
        "concurrency": config.concurrency if config else 0,
        "config_json": orjson.dumps(snap).decode(),
        "expects": bool(config.reasoning.expect) if config else True,
        "t": t,
    }
    run_id = int(
        conn.execute(
            text(
                "INSERT INTO run (name, kind, status, desired, cap, concurrency, config_json, expects_reasoning,"
                " created_at, updated_at, total, n_pending, n_in_flight, n_ok, n_error, n_timeout, n_cancelled,"
                " config_version, n_rerun, repair_seq)"
                " VALUES (:name, :kind, 'created', 'run', :cap, :concurrency, :config_json, :expects, :t, :t,"
                " 0, 0, 0, 0, 0, 0, 0, 1, 0, 0) RETURNING id"
            ),
            params,
        ).scalar_one()
    )
    # version 1 of the run's settings (synthwatch.store.versions keeps every later one)
    conn.execute(
        text("INSERT INTO config_version (run_id, version, created_at, actor, reason, config_json, changes_json)"
             " VALUES (:r, 1, :t, :a, NULL, :c, '[]')"),
        {"r": run_id, "t": t, "a": kind, "c": params["config_json"]},
    )
    return run_id


# below every real key (those are in [0, 1)): sampling queries ask for rnd >= x with x in [0, 1)
PENDING_RND = -1.0


def insert_prompts(conn: Connection, run_id: int, prompts: Iterable[Any], *, batch: int = 5000,
                   turns: str = "last", samples: int = 1) -> int:
    """Load prompts (objects with index, line, source_id, messages) as pending records.

    Their sampling key ``rnd`` is PENDING_RND; the writer draws the random one when the record finishes. Every
    index holding (status, rnd) then moves a claimed or finished record's entry within a run of consecutive
    ids instead of to a random page: with random keys, each claim and each final update dirtied several
    random index pages, which doubled the worker's write cost (measured).

    ``turns`` is the run's setting: with "all" each record counts the assistant turns the model will write
    (synthwatch.capture.turns), and the run's n_turns their sum.

    ``samples`` (samples_per_prompt = k): each dataset prompt becomes k records, sample s of prompt p at
    idx = p * k + s with prompt_idx = p, inserted next to each other (the claim takes a prompt's samples
    together). A canary (negative index) stays one record."""
    from ..capture import turns as turns_mod

    # the driver's own executemany with tuples: through text() SQLAlchemy built each row's parameters in Python,
    # half of loading 20,000 prompts (0.35 CPU-s; #25). Placeholders in the driver's style (SQLite ?, psycopg %s).
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = ("INSERT INTO record (run_id, idx, prompt_idx, sample_index, source_id, source_line, rnd, prompt_json,"
           " status, content_null, attempts, check_flags, n_turns, turns_done, row_json) VALUES"
           f" ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}, {PENDING_RND}, {mark}, 'pending', false, 0, 0, {mark},"
           f" 0, {mark})")
    k_samples = max(1, int(samples))
    n = n_turns = 0
    buf: list[tuple[Any, ...]] = []
    dumps = orjson.dumps
    count_all = turns != "last"
    for p in prompts:
        k = turns_mod.count(p.messages, turns) if count_all and p.index >= 0 else 1
        prompt = dumps(p.messages).decode()
        # the row's fields the extended checks read (#30): a verifier's reference stays with its record
        row_json = dumps(row, default=str).decode() if (row := getattr(p, "row", None)) else None
        for s in range(k_samples if p.index >= 0 else 1):
            n_turns += k
            buf.append((run_id, p.index * k_samples + s if p.index >= 0 else p.index, p.index, s, p.source_id,
                        p.line, prompt, k, row_json))
        if len(buf) >= batch:
            conn.exec_driver_sql(sql, buf)
            n += len(buf)
            buf = []
    if buf:
        conn.exec_driver_sql(sql, buf)
        n += len(buf)
    conn.execute(
        text("UPDATE run SET total = total + :n, n_pending = n_pending + :n, n_turns = n_turns + :k,"
             " updated_at = :t WHERE id = :r"),
        {"n": n, "k": n_turns, "t": now(), "r": run_id},
    )
    return n


def set_status(conn: Connection, run_id: int, status: str, message: str | None = None) -> None:
    t = now()
    extra = ""
    if status == "running":
        extra = ", started_at = COALESCE(started_at, :t), finished_at = NULL"
    elif status in ("completed", "stopped", "failed"):
        extra = ", finished_at = :t"
    conn.execute(
        text(f"UPDATE run SET status = :s, status_message = :m, updated_at = :t{extra} WHERE id = :r"),
        # the message may quote a server (a failed run's last error): made storable and redacted (store/rows.py)
        {"s": status, "m": rows.clean("run", {"m": message})["m"], "t": t, "r": run_id},
    )


def add_event(conn: Connection, run_id: int, action: str, value: Any = None, actor: str = "cli",
              detail: str | None = None) -> None:
    # the audit log quotes people's and servers' words: through the store's one way in (store/rows.py)
    rows.write(conn, "control_event", [{"r": run_id, "t": now(), "a": action, "v": None if value is None else value,
                                         "actor": actor, "d": detail}])


def apply_control(engine: Engine, run_id: int, action: str, value: Any = None, actor: str = "ui",
                  detail: str | None = None, *, ack_records: int | None = None,
                  ack_minutes: float | None = None) -> dict[str, Any]:
    """Record a control request; workers read it within their control interval (~0.25 s).

    A resume asks detection (:func:`resume_gate`) in the same transaction: while a pausing alarm is open and not
    snoozed it raises AlarmOpen unless the resume acknowledges that alarm, for ``ack_records`` more claims or
    ``ack_minutes`` minutes."""
    if action not in CONTROL_ACTIONS:
        raise ControlError(f"unknown control action {action!r}; expected one of {', '.join(CONTROL_ACTIONS)}")
    sets: dict[str, Any] = {}
    if action == "pause":
        # what the pause does to the requests in flight (#36): cancel them or let them finish (none: finish)
        if value not in (None, "", "cancel", "finish"):
            raise ControlError(f"pause takes 'cancel' or 'finish' (the requests in flight), got {value!r}")
        sets["desired"] = "pause"
        sets["pause_in_flight"] = value or "finish"
    elif action == "resume":
        sets["desired"] = "run"
        sets["pause_in_flight"] = None  # the next pause's own choice (an alarm's: its check says)
    elif action == "stop":
        sets["desired"] = "stop"
    elif action == "stop_now":
        sets["desired"] = "stop_now"
    elif action == "cap":
        if value in (None, "", "none", "None"):
            sets["cap"] = None
        else:
            try:
                cap = int(value)
            except (TypeError, ValueError):
                raise ControlError(f"cap must be a positive whole number, got {value!r}") from None
            if cap < 1 or cap > 1_000_000_000:
                raise ControlError(f"cap must be between 1 and 1,000,000,000, got {cap}")
            sets["cap"] = cap
    elif action == "concurrency":
        try:
            c = int(value)
        except (TypeError, ValueError):
            raise ControlError(f"concurrency must be a whole number, got {value!r}") from None
        if c < 1 or c > 100_000:
            raise ControlError(f"concurrency must be between 1 and 100,000, got {c}")
        sets["concurrency"] = c
    if action != "resume" and (ack_records is not None or ack_minutes is not None):
        raise ControlError("an acknowledgement (for N records or M minutes) goes with resume only")
    with engine.connect() as conn, write_begin(conn):
        lock_run(conn, run_id)
        row = conn.execute(text("SELECT status, kind, total, n_pending FROM run WHERE id = :r"),
                           {"r": run_id}).first()
        if row is None:
            raise NotFound(f"no run {run_id}")
        if action == "resume":
            claimed = int(row[2] or 0) - int(row[3] or 0)
            acked = resume_gate(conn, run_id, claimed, ack_records=ack_records, ack_minutes=ack_minutes, actor=actor)
            if acked:
                sets["acknowledged"] = acked
        assign = ", ".join(f"{k} = :{k}" for k in sets if k != "acknowledged")
        conn.execute(text(f"UPDATE run SET {assign}, updated_at = :t WHERE id = :r"),
                     {**{k: v for k, v in sets.items() if k != "acknowledged"}, "t": now(), "r": run_id})
        add_event(conn, run_id, action, value, actor, detail)
    return sets


# ---------------------------------------------------------------- the pausing-alarm gate

# Detection (synthwatch.quality.detection: claim_gate and resume_gate, registered when it is imported) owns the
# alarms, their snoozes and acknowledgements. The claim asks it which alarms hold the run and how many claims
# bounded acknowledgements still allow; a resume asks it whether an alarm holds the run and lets it record the
# resume's acknowledgement. The store does not import it (imports go downwards); without a registered gate a claim
# or a resume refuses rather than go around alarms.
Gate = Callable[..., tuple[list[dict[str, Any]], "int | None"]]
ResumeGate = Callable[..., list[dict[str, Any]]]
_gate: list[Gate] = []
_resume_gate: list[ResumeGate] = []


def set_claim_gate(gate: Gate, resume: ResumeGate) -> None:
    _gate[:] = [gate]
    _resume_gate[:] = [resume]


def _no_gate() -> RuntimeError:
    return RuntimeError("no claim gate registered: import synthwatch.quality.detection before claiming")


def alarm_gate(conn: Connection, run_id: int, claimed: int, t: float, *,
               reopen: bool = True) -> tuple[list[dict[str, Any]], int | None]:
    """(blocking alarms, claims still allowed or None): detection's answer (see set_claim_gate)."""
    if not _gate:
        raise _no_gate()
    return _gate[0](conn, run_id, claimed, t, reopen=reopen)


def resume_gate(conn: Connection, run_id: int, claimed: int, *, ack_records: int | None, ack_minutes: float | None,
                actor: str) -> list[dict[str, Any]]:
    """Detection's answer to a resume (see set_claim_gate): the alarms it acknowledged, or AlarmOpen."""
    if not _resume_gate:
        raise _no_gate()
    return _resume_gate[0](conn, run_id, claimed, ack_records=ack_records, ack_minutes=ack_minutes, actor=actor)


def alarm_names(blocked: list[dict[str, Any]]) -> str:
    return "; ".join(f"alarm #{a['id']} {a['rule']} ({a['title']})" for a in blocked)


def ack_hint(conn: Connection, run_id: int, blocked: list[dict[str, Any]]) -> str:
    """The command that acknowledges the alarms holding this run and resumes it (#37): the run's name, this
    database and a number of records (the first alarm's window: after as many new records it may fire again)."""
    name = conn.execute(text("SELECT name FROM run WHERE id = :r"), {"r": run_id}).scalar()
    rule = DEFAULT_RULES.get(blocked[0]["rule"]) if blocked else None
    return hint("control", "resume", "--ack", "--for-records", rule.window if rule else 100,
                run=str(name if name is not None else run_id), db=conn.engine.url.render_as_string(hide_password=True))


def hold_for_alarms(conn: Connection, run_id: int, blocked: list[dict[str, Any]]) -> None:
    """The claim found a pausing alarm open: the run pauses (again), saying why, and claims nothing."""
    if conn.execute(text("UPDATE run SET desired = 'pause', updated_at = :t WHERE id = :r AND desired = 'run'"),
                    {"t": now(), "r": run_id}).rowcount:
        add_event(conn, run_id, "pause", None, actor="alarm",
                  detail=f"{alarm_names(blocked)} is open and not acknowledged: no record is claimed until it is"
                         " acknowledged (Acknowledge and resume) or cleared")


def last_failure(conn: Connection, run_id: int) -> str:
    """The latest final failed attempt's text (HTTP status and the server's message; redacted when recorded)."""
    row = conn.execute(text("SELECT message FROM error_event WHERE run_id = :r AND final ORDER BY id DESC LIMIT 1"),
                       {"r": run_id}).first()
    msg = " ".join(str(row[0] or "").split()) if row is not None else ""
    return msg if len(msg) <= 300 else msg[:299] + "…"


def claimed_count(conn: Connection, run_id: int) -> int:
    """Records the run has claimed so far (total - pending): what a bounded acknowledgement counts."""
    row = conn.execute(text("SELECT total, n_pending FROM run WHERE id = :r"), {"r": run_id}).first()
    return int(row[0] or 0) - int(row[1] or 0) if row is not None else 0


def pause_reason(conn: Connection, run_id: int) -> tuple[str, tuple[str, ...]]:
    """Why a paused run waits, in a line for the status and the terminal, and the rules of the alarms that hold
    it (('', ()) when none does)."""
    t = now()
    blocked = alarm_gate(conn, run_id, claimed_count(conn, run_id), t, reopen=False)[0]
    if not blocked:
        return "", ()
    a = blocked[0]
    said = ""
    try:
        ev = orjson.loads(a["evidence_json"]) if a["evidence_json"] else {}
    except orjson.JSONDecodeError:
        ev = {}
    ctx = ev.get("ctx") if isinstance(ev, dict) else None
    if isinstance(ctx, dict) and ctx.get("server_said"):
        said = f"; the server said: {str(ctx['server_said'])[:300]}"
    more = f" (and {len(blocked) - 1} more)" if len(blocked) > 1 else ""
    rule = DEFAULT_RULES.get(a["rule"])
    title = a["title"] or (rule.title if rule else a["rule"])
    return (f"paused by alarm #{a['id']} {a['rule']}: {title}{more}{said}. Acknowledge and resume to go on"
            f" ({ack_hint(conn, run_id, blocked)}), or fix the cause",
            tuple(sorted({b["rule"] for b in blocked})))


# ---------------------------------------------------------------- workers


def register_worker(conn: Connection, run_id: int) -> int:
    t = now()
    return int(
        conn.execute(
            text("INSERT INTO worker (run_id, host, pid, started_at, heartbeat_at, status, claimed, done,"
                 " stats_json) VALUES (:r, :h, :p, :t, :t, 'running', 0, 0, '{}') RETURNING id"),
            {"r": run_id, "h": socket.gethostname(), "p": os.getpid(), "t": t},
        ).scalar_one()
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_dead_claims(conn: Connection, run_id: int, stale_after_s: float) -> int:
    """Return to pending the claims of workers that are gone.

    A worker on this host whose pid no longer exists is gone at once (a kill -9 restart resumes
    immediately); others are gone when their lease has expired.
    """
    t = now()
    host = socket.gethostname()
    dead: list[int] = []
    for wid, whost, pid, hb in conn.execute(
        text("SELECT id, host, pid, heartbeat_at FROM worker WHERE run_id = :r AND status = 'running'"),
        {"r": run_id},
    ):
        if (whost == host and pid != os.getpid() and not _pid_alive(pid)) or hb < t - stale_after_s:
            dead.append(wid)
    for wid in dead:
        conn.execute(text("UPDATE worker SET status = 'dead' WHERE id = :w"), {"w": wid})
    moved = 0
    if dead:
        ids = ",".join(str(int(w)) for w in dead)
        moved += conn.execute(
            text(f"UPDATE record SET status = 'pending', worker_id = NULL, lease_until = NULL"
                 f" WHERE run_id = :r AND status = 'in_flight' AND worker_id IN ({ids})"),
            {"r": run_id},
        ).rowcount or 0
    moved += conn.execute(
        text("UPDATE record SET status = 'pending', worker_id = NULL, lease_until = NULL"
             " WHERE run_id = :r AND status = 'in_flight' AND (lease_until < :t OR worker_id IS NULL"
             " OR worker_id IN (SELECT id FROM worker WHERE run_id = :r AND status != 'running'))"),
        {"r": run_id, "t": t},
    ).rowcount or 0
    _count_back_to_pending(conn, run_id, moved)
    return moved


def _count_back_to_pending(conn: Connection, run_id: int, moved: int) -> None:
    if moved:
        conn.execute(
            text("UPDATE run SET n_in_flight = n_in_flight - :n, n_pending = n_pending + :n WHERE id = :r"),
            {"n": moved, "r": run_id},
        )


def int_lists(values: list[int], size: int = 500) -> Iterator[str]:
    """``values`` as comma-separated literals for ``IN (...)``, ``size`` at a time: ints only, so inlining
    them is safe, and one statement per few hundred rows instead of a bound parameter each."""
    for i in range(0, len(values), size):
        yield ",".join(str(int(x)) for x in values[i:i + size])


def release_claims(conn: Connection, run_id: int, worker_id: int, ids: list[int]) -> int:
    """Return this worker's claimed, never started records to pending (a pause, a stop, a changed cap).

    Only rows the worker still holds move: a claim taken over after an expired lease is left alone."""
    moved = 0
    for chunk in int_lists(ids):
        moved += conn.execute(
            text(f"UPDATE record SET status = 'pending', worker_id = NULL, lease_until = NULL, claimed_at = NULL"
                 f" WHERE id IN ({chunk}) AND worker_id = :w AND status = 'in_flight'"),
            {"w": worker_id},
        ).rowcount or 0
    _count_back_to_pending(conn, run_id, moved)
    return moved


def release_worker(conn: Connection, run_id: int, worker_id: int, interrupted: list[dict[str, Any]]) -> int:
    """Every record this worker still holds back to pending: the last thing a worker does, after its writer ended.

    ``interrupted``: the records whose request was cut short, each with its attempt history (id, attempts,
    attempts_json, error_kind, error), kept on the record; the others (never started, or finished with a
    result that was never written) go back as they were. Only rows the worker still holds move. Returns how many."""
    if interrupted:  # their history first (they stay held), then one statement moves all: one row count to trust
        conn.execute(
            text("UPDATE record SET attempts = :attempts, attempts_json = :attempts_json, error_kind = :error_kind,"
                 " error = :error WHERE id = :id AND run_id = :r AND worker_id = :w AND status = 'in_flight'"),
            [{**row, "r": run_id, "w": worker_id} for row in interrupted],
        )
    moved = conn.execute(
        text("UPDATE record SET status = 'pending', worker_id = NULL, lease_until = NULL, claimed_at = NULL"
             " WHERE run_id = :r AND worker_id = :w AND status = 'in_flight'"),
        {"r": run_id, "w": worker_id},
    ).rowcount or 0
    _count_back_to_pending(conn, run_id, moved)
    if moved:  # its claims in all, as the writer counts them: a claim handed back was not claimed
        conn.execute(text("UPDATE worker SET claimed = claimed - :n WHERE id = :w"), {"n": moved, "w": worker_id})
    return moved


def recount(conn: Connection, run_id: int) -> None:
    """Recompute the run's counters from the records (after a crash, counters are re-derived)."""
    counts = {s: 0 for s in RECORD_STATUSES}
    for status, n in conn.execute(
        text("SELECT status, COUNT(*) FROM record WHERE run_id = :r GROUP BY status"), {"r": run_id}
    ):
        counts[status] = n
    n_turns, n_done = conn.execute(
        text("SELECT COALESCE(SUM(n_turns), 0), COALESCE(SUM(turns_done), 0) FROM record WHERE run_id = :r"),
        {"r": run_id}).one()
    conn.execute(
        text("UPDATE run SET n_pending = :pending, n_in_flight = :in_flight, n_ok = :ok, n_error = :error,"
             " n_timeout = :timeout, n_cancelled = :cancelled, total = :total, n_turns = :nt, n_turns_done = :nd"
             " WHERE id = :r"),
        {**counts, "total": sum(counts.values()), "nt": int(n_turns), "nd": int(n_done), "r": run_id},
    )


def claim_sql(skip: str = "") -> str:
    """The claim statement (named parameters w, lease, t, r, n); the benchmark's SQLite floor runs it too."""
    return ("UPDATE record SET status = 'in_flight', worker_id = :w, lease_until = :lease, claimed_at = :t"
            " WHERE id IN (SELECT id FROM record WHERE run_id = :r AND status = 'pending' ORDER BY id"
            f" LIMIT :n{skip}) RETURNING id, idx, prompt_json, attempts, attempts_json, rerun, n_turns, turns_json,"
            " sample_index, prompt_idx")


def _claim_rest_of_prompt(conn: Connection, run_id: int, worker_id: int, prompt_idx: int, room: int, t: float,
                          lease_s: float) -> list[Any]:
    """The pending samples of ``prompt_idx`` a claim left behind (at most ``room``): a prompt's samples go out as
    one request with n = k (samples_in_one_request)."""
    if room <= 0:
        return []
    skip = " FOR UPDATE SKIP LOCKED" if is_pg(conn) else ""
    return list(conn.execute(
        text("UPDATE record SET status = 'in_flight', worker_id = :w, lease_until = :lease, claimed_at = :t"
             " WHERE id IN (SELECT id FROM record WHERE run_id = :r AND status = 'pending' AND prompt_idx = :p"
             f" ORDER BY id LIMIT :n{skip}) RETURNING id, idx, prompt_json, attempts, attempts_json, rerun, n_turns,"
             " turns_json, sample_index, prompt_idx"),
        {"w": worker_id, "lease": t + lease_s, "t": t, "r": run_id, "p": prompt_idx, "n": room}).all())


def claim(conn: Connection, run_id: int, worker_id: int, n: int, lease_s: float, *,
          whole_prompts: bool = False) -> tuple[list[Claimed], str]:
    """Claim up to n pending records; never more than the cap allows. Returns (claimed, why_short).

    ``whole_prompts`` (samples_in_one_request): the last prompt's other pending samples come too, beyond n but
    never beyond the cap, so that a prompt's samples go out together as one request.

    why_short: "" (got n), "empty" (fewer pending than asked), "cap" (cap reached counting
    in-flight), "cap_done"/"done" (nothing left anywhere: the run is complete), or the run's
    desired state when it is not "run".

    Must run inside a write transaction (write_begin)."""
    lock = " FOR UPDATE" if is_pg(conn) else ""
    row = conn.execute(
        text(f"SELECT cap, desired, n_ok, n_in_flight, n_pending, total FROM run WHERE id = :r{lock}"),
        {"r": run_id}).first()
    if row is None:
        return [], "run deleted"
    cap, desired, n_ok, n_in_flight, n_pending, total = row
    if desired != "run":
        return [], desired
    limited = ""
    if cap is not None and cap - n_ok - n_in_flight < n:
        n = cap - n_ok - n_in_flight
        limited = "cap"
        if n <= 0:
            return [], "cap_done" if n_ok >= cap and n_in_flight == 0 else "cap"
    if n_pending <= 0:
        return [], "done" if n_in_flight == 0 else "empty"
    if n <= 0:
        return [], "empty"
    t = now()
    # the pausing-alarm gate: read here, in the claim's transaction, by every worker (never from a cache)
    blocked, left = alarm_gate(conn, run_id, int(total or 0) - int(n_pending or 0), t)
    if blocked:
        hold_for_alarms(conn, run_id, blocked)
        return [], "alarm"
    if left is not None and left < n:
        n, limited = left, "snooze"
    rows = conn.execute(
        text(claim_sql(" FOR UPDATE SKIP LOCKED" if is_pg(conn) else "")),
        {"w": worker_id, "lease": t + lease_s, "t": t, "r": run_id, "n": n},
    ).all()
    asked = len(rows)
    if whole_prompts and rows:
        room = (cap - n_ok - n_in_flight - len(rows)) if cap is not None else 1 << 30
        if left is not None:
            room = min(room, left - len(rows))
        last = max(rows, key=lambda r: r[0])[9]
        if last is not None:
            rows = list(rows) + _claim_rest_of_prompt(conn, run_id, worker_id, last, room, t, lease_s)
    if rows:
        conn.execute(
            text("UPDATE run SET n_in_flight = n_in_flight + :k, n_pending = n_pending - :k WHERE id = :r"),
            {"k": len(rows), "r": run_id},
        )
    claimed = [Claimed(r[0], r[1], orjson.loads(r[2]), r[3] or 0, r[4], bool(r[5]), r[6] or 1, r[7], r[8] or 0,
                       r[9] if r[9] is not None else -1) for r in rows]
    claimed.sort(key=lambda c: c.id)
    return claimed, limited if asked == n else "empty"


def live_runs(conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(
        text("SELECT * FROM run WHERE status IN ('created','running','paused','stopping') ORDER BY id")
    ).mappings()]
