"""Verdicts of the extended checks: what a check says about one record, stored after the record (#30).

The built-in checks are cheap and run in the writer (a bit in ``record.check_flags``). The extended ones
(verifiers, user checks, TOML rules, language, near-duplicates, judges) may be slow: they run off the writer
thread (synthwatch.quality.extended) and their verdicts are appended to ``check_verdict``, one row per verdict.
The latest row per (record_id, check_name) by id is the verdict in force; a record whose latest row is
'pending', or that has no row for a check the run computes, is *pending* for that check.

Stable API (other modules code against it):

- :class:`Verdict` (state, score, label, reason) and the :class:`Check` protocol;
- :func:`latest` (run_id, check_name=None) -> {record_id: {check_name: StoredVerdict}};
- :func:`pending_count` (run_id) -> finished ok records still waiting for at least one configured check;
- :func:`record_verdicts` (record_id) -> [StoredVerdict], the latest per check, by name;
- :func:`append` writes verdicts (history is appended, never updated).

Each function takes a SQLAlchemy ``Connection`` or ``Session`` (anything with ``execute(text(...))``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from sqlalchemy import text

from ..check_catalog import CheckSettings
from ..store import rows as store_rows
from .checks import RecordView

STATES = ("pending", "pass", "fail", "error")
FINAL_STATES = ("pass", "fail", "error")
REASON_MAX = store_rows.REASON_MAX
LABEL_MAX = store_rows.LABEL_MAX


def bound(s: Any, limit: int = REASON_MAX) -> str | None:
    """A reason or label as stored: text, at most `limit` characters (untrusted: escaped where shown)."""
    if s is None:
        return None
    s = s if isinstance(s, str) else str(s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one check says about one record: state is pending | pass | fail | error."""

    state: str
    score: float | None = None
    label: str | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"verdict state must be one of {', '.join(STATES)}, got {str(self.state)[:40]!r}")

    @property
    def failed(self) -> bool:
        return self.state == "fail"


PASS = Verdict("pass")


@dataclass(frozen=True, slots=True)
class StoredVerdict:
    """A verdict as stored, with its record, check, cost and time."""

    id: int
    record_id: int
    check_name: str
    verdict: Verdict
    cost_ms: float | None
    created_at: float

    @property
    def state(self) -> str:
        return self.verdict.state


class Check(Protocol):
    """An extended check: the record as the built-in checks see it, plus its dataset row's fields (e.g. the
    reference answer, from record.row_json), to a verdict. Raising or running over the time budget is recorded
    as the check's 'error' verdict on that record."""

    def __call__(self, record: RecordView, row: Mapping[str, Any]) -> Verdict: ...


def row_fields(row_json: str | None) -> dict[str, Any]:
    """The dataset row's fields kept with a record (record.row_json), {} when none or unreadable."""
    if not row_json:
        return {}
    try:
        v = orjson.loads(row_json)
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def configured_checks(config: str | Mapping[str, Any] | None) -> list[str]:
    """Catalogue names of the extended checks a run computes, from its stored config snapshot (JSON or a dict)."""
    try:
        cfg = orjson.loads(config or "{}") if config is None or isinstance(config, str) else config
        return CheckSettings.model_validate((cfg if isinstance(cfg, Mapping) else {}).get("checks") or {}
                                            ).extended_names()
    except (orjson.JSONDecodeError, ValueError):
        return []


def _stored(row: Any) -> StoredVerdict:
    return StoredVerdict(row[0], row[1], row[2], Verdict(row[3], row[4], row[5], row[6]), row[7], row[8])


_COLS = "v.id, v.record_id, v.check_name, v.state, v.score, v.label, v.reason, v.cost_ms, v.created_at"
# the latest row of each (record, check): no later row of the same pair (answered by ix_check_verdict_record)
_LATEST = ("NOT EXISTS (SELECT 1 FROM check_verdict w WHERE w.record_id = v.record_id"
           " AND w.check_name = v.check_name AND w.id > v.id)")


def latest(session: Any, run_id: int, check_name: str | None = None) -> dict[int, dict[str, StoredVerdict]]:
    """The verdict in force per record and check of a run: {record_id: {check_name: StoredVerdict}}."""
    sql = f"SELECT {_COLS} FROM check_verdict v WHERE v.run_id = :r AND {_LATEST}"
    params: dict[str, Any] = {"r": run_id}
    if check_name is not None:
        sql += " AND v.check_name = :c"
        params["c"] = check_name
    out: dict[int, dict[str, StoredVerdict]] = {}
    for row in session.execute(text(sql + " ORDER BY v.record_id, v.check_name"), params):
        sv = _stored(row)
        out.setdefault(sv.record_id, {})[sv.check_name] = sv
    return out


def record_verdicts(session: Any, record_id: int) -> list[StoredVerdict]:
    """The verdict in force of each check on one record, by check name."""
    rows = session.execute(
        text(f"SELECT {_COLS} FROM check_verdict v WHERE v.record_id = :i AND {_LATEST} ORDER BY v.check_name"),
        {"i": record_id},
    )
    return [_stored(r) for r in rows]


def pending_ids(session: Any, run_id: int, checks: Sequence[str] | None = None, limit: int | None = None) -> list[int]:
    """Finished ok records of a run still waiting for a configured check (latest verdict pending, or none)."""
    names = list(checks) if checks is not None else configured_checks(
        session.execute(text("SELECT config_json FROM run WHERE id = :r"), {"r": run_id}).scalar())
    if not names:
        return []
    sql = text(
        "SELECT r.id FROM record r WHERE r.run_id = :r AND r.status = 'ok' AND (" + " OR ".join(
            f"NOT EXISTS (SELECT 1 FROM check_verdict v WHERE v.record_id = r.id AND v.check_name = :c{i}"
            f" AND v.state != 'pending' AND {_LATEST})" for i in range(len(names))) + ") ORDER BY r.id"
        + (" LIMIT :n" if limit is not None else ""))
    params: dict[str, Any] = {"r": run_id, **{f"c{i}": n for i, n in enumerate(names)}}
    if limit is not None:
        params["n"] = limit
    return [r[0] for r in session.execute(sql, params)]


def pending_count(session: Any, run_id: int, checks: Sequence[str] | None = None) -> int:
    """How many finished ok records of a run still wait for at least one configured extended check."""
    return len(pending_ids(session, run_id, checks))


def pending_estimate(session: Any, run_id: int, n_ok: int, checks: Sequence[str]) -> int:
    """Records waiting for a verdict, for a page polled while the run is live: ok records minus the answered
    verdict rows of the least-answered check (one index range per check). Exact while no record was checked
    twice; a re-check's extra rows make it low, never high. pending_count is the exact (slower) answer."""
    if not checks or n_ok <= 0:
        return 0
    got = dict.fromkeys(checks, 0)
    for name, n in session.execute(
        text("SELECT check_name, COUNT(*) FROM check_verdict WHERE run_id = :r AND state != 'pending'"
             " GROUP BY check_name"), {"r": run_id},
    ):
        if name in got:
            got[name] = int(n)
    return max(0, n_ok - min(got.values()))


@dataclass(frozen=True, slots=True)
class NewVerdict:
    run_id: int
    record_id: int
    check_name: str
    verdict: Verdict
    cost_ms: float | None = None


def append(session: Any, verdicts: Iterable[NewVerdict], now: float | None = None) -> int:
    """Append verdicts through the store's one way in (store/rows.py): label and reason redacted, bounded and made
    storable; a verdict the database still refuses becomes that check's error verdict on its record, never a lost
    batch. Returns how many rows were written."""
    t = time.time() if now is None else now
    rows = [{"r": v.run_id, "i": v.record_id, "c": v.check_name, "s": v.verdict.state,
             "sc": v.verdict.score, "l": v.verdict.label, "re": v.verdict.reason,
             "ms": v.cost_ms, "t": t} for v in verdicts]
    return len(store_rows.write(session, "check_verdict", rows)) if rows else 0


def mark_pending(session: Any, run_id: int, record_ids: Sequence[int], checks: Sequence[str]) -> int:
    """Append a 'pending' row per record and check: a re-check is due (recompute, a new check on a finished run)."""
    return append(session, (NewVerdict(run_id, rid, c, Verdict("pending")) for rid in record_ids for c in checks))


def state_counts(session: Any, run_id: int) -> dict[str, dict[str, int]]:
    """{check_name: {state: records}} over the verdicts in force of a run."""
    out: dict[str, dict[str, int]] = {}
    for name, state, n in session.execute(
        text(f"SELECT v.check_name, v.state, COUNT(*) FROM check_verdict v WHERE v.run_id = :r AND {_LATEST}"
             " GROUP BY v.check_name, v.state"), {"r": run_id},
    ):
        out.setdefault(name, {})[state] = n
    return out


__all__ = ["FINAL_STATES", "PASS", "STATES", "Check", "NewVerdict", "StoredVerdict", "Verdict", "append", "bound",
           "configured_checks", "latest", "mark_pending", "pending_count", "pending_estimate", "pending_ids",
           "record_verdicts",
           "row_fields", "state_counts"]
