"""What an export selects by the checks (#38): ``--exclude-check``, ``--select-check`` and ``--where``, every name
resolved in the run's one catalogue (synthwatch.quality.selection), and the per-prompt counts of the manifest.

- ``--exclude-check NAME`` (repeatable): a built-in check leaves out the records with its bit in check_flags (as
  before); any other check (verifier, user, rule, language, near_duplicate, judge) leaves out the records whose
  verdict in force is ``fail``. Each is counted under ``check:NAME``.
- ``--where EXPR``: only records the expression selects; the others are counted under ``where``.
- ``--select-check NAME`` (repeatable): the checks the per-prompt selection reads (export/select.py), combined with
  AND. Without one, the run's first answer verifier.

The record ids each criterion needs are read once, with one statement each, when the export starts (sorted arrays:
8 bytes per matching record), so the pages themselves stay the plain keyset reads of stream.py.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..quality.selection import (
    Catalogue,
    UnknownCheck,
    Where,
    WhereError,
    any_of,
    catalogue,
    check_is,
    excludes_failing,
    parse_where,
    record_ids,
)
from .plan import ExportError

R_WHERE = "where"
PROMPTS_LISTED = 1000


def _has(ids: array | None, rid: int) -> bool:
    if ids is None:
        return False
    i = bisect_left(ids, rid)
    return i < len(ids) and ids[i] == rid


@dataclass
class Criteria:
    """The checks an export reads, resolved; :meth:`load` reads the records they select when the export starts."""

    cat: Catalogue
    exclude_builtin: tuple[str, ...] = ()
    exclude_verdicts: tuple[str, ...] = ()
    select_checks: tuple[str, ...] = ()
    where: Where | None = None
    failing: dict[str, array] = field(default_factory=dict)
    matching: array | None = None
    pending: array | None = None

    @property
    def verdict_checks(self) -> tuple[str, ...]:
        """The checks read from stored verdicts, whose pending records make a prompt 'pending'."""
        names = [*self.exclude_verdicts, *(n for n in self.select_checks if n in self.cat.extended)]
        if self.where is not None:
            names += self.where.verdict_names
        return tuple(dict.fromkeys(names))

    def load(self, engine: Engine, run_id: int) -> None:
        with engine.connect() as conn:
            for name in self.exclude_verdicts:
                self.failing[name] = array("q", record_ids(conn, run_id, check_is(self.cat, name), status="ok"))
            if self.where is not None:
                self.matching = array("q", record_ids(conn, run_id, self.where, status="ok"))
            names = self.verdict_checks
            if names:
                self.pending = array("q", record_ids(
                    conn, run_id, any_of(*(check_is(self.cat, n, "pending") for n in names)), status="ok"))
            conn.rollback()

    def reason(self, record_id: int) -> str | None:
        """Why the checks leave this record out (after the built-in exclusions), or None."""
        for name in self.exclude_verdicts:
            if _has(self.failing.get(name), record_id):
                return f"check:{name}"
        if self.where is not None and not _has(self.matching, record_id):
            return R_WHERE
        return None

    def is_pending(self, record_id: int) -> bool:
        return _has(self.pending, record_id)

    def left_out(self) -> tuple[str, ...]:
        """Checks whose every failing record this export leaves out (their alarms need not hold it)."""
        out = [*self.exclude_builtin, *self.exclude_verdicts]
        if self.where is not None:
            out += excludes_failing(self.where)
        return tuple(dict.fromkeys(out))

    def manifest(self) -> dict[str, Any]:
        return {"expression": self.where.text if self.where is not None else None,
                "exclude_checks": [*self.exclude_builtin, *self.exclude_verdicts],
                "select_checks": list(self.select_checks)}


def resolve(engine: Engine, run: Mapping[str, Any], config: Mapping[str, Any], exclude: Sequence[str],
            select_checks: Sequence[str], where: str | None, select_mode: str) -> Criteria:
    """Resolve the export's check names and expression in the run's catalogue; ExportError (one line, with "did you
    mean") for an unknown name or a bad expression."""
    from ..quality.passk import verifier_check

    with engine.connect() as conn:
        cat = catalogue(conn, int(run["id"]))
        conn.rollback()
    crit = Criteria(cat)
    try:
        names = [cat.resolve(n, "--exclude-check") for n in (s.strip() for s in exclude) if n]
        crit.exclude_builtin = tuple(dict.fromkeys(n for n in names if cat.is_builtin(n)))
        crit.exclude_verdicts = tuple(dict.fromkeys(n for n in names if not cat.is_builtin(n)))
        chosen = [cat.resolve(n, "--select-check") for n in (s.strip() for s in select_checks) if n]
        if where is not None and where.strip():
            crit.where = parse_where(where, cat, source="--where")
    except (UnknownCheck, WhereError) as exc:
        raise ExportError(str(exc)) from None
    if select_mode == "all":
        if chosen:
            raise ExportError("--select-check goes with --select passing, first-passing or best")
        return crit
    if not chosen:
        default = verifier_check(dict(config))
        if not default:
            raise ExportError(f"--select {select_mode} picks by a check's verdicts, and run {run['name']!r} has no "
                              "answer verifier: name the check with --select-check (e.g. judge)")
        chosen = [cat.resolve(default)] if default in cat else [default]
    crit.select_checks = tuple(dict.fromkeys(chosen))
    return crit


class PromptTally:
    """Per prompt of the export (canaries are not prompts): was a record of it exported, and if not, is one of its
    records still waiting for a verdict the export reads. One byte per prompt index."""

    SEEN, SELECTED, PENDING = 1, 2, 4

    def __init__(self) -> None:
        self.state = bytearray()

    def see(self, prompt: int, exported: bool, pending: bool) -> None:
        if prompt < 0:
            return
        if prompt >= len(self.state):
            self.state.extend(bytes(max(prompt + 1 - len(self.state), len(self.state))))
        self.state[prompt] |= self.SEEN | (self.SELECTED if exported else 0) | (self.PENDING if pending else 0)

    def summary(self, engine: Engine, run_id: int) -> dict[str, Any]:
        seen = selected = pending = 0
        no_pass: list[int] = []
        waiting: list[int] = []
        for p, s in enumerate(self.state):
            if not s:
                continue
            seen += 1
            if s & self.SELECTED:
                selected += 1
            elif s & self.PENDING:
                pending += 1
                if len(waiting) < PROMPTS_LISTED:
                    waiting.append(p)
            elif len(no_pass) < PROMPTS_LISTED + 1:
                no_pass.append(p)
        n_no_pass = seen - selected - pending
        return {"prompts": seen, "selected": selected, "no_pass": n_no_pass, "pending": pending,
                "no_pass_prompts": prompt_ids(engine, run_id, no_pass[:PROMPTS_LISTED]),
                "pending_prompts": prompt_ids(engine, run_id, waiting),
                "prompts_listed_complete": n_no_pass <= PROMPTS_LISTED and pending <= PROMPTS_LISTED,
                "note": "per prompt with an ok record: selected (at least one record exported), pending (none "
                        "exported and one is still waiting for a verdict the export reads: export again later), "
                        "no_pass (none exported, none waiting)"}


def prompt_ids(engine: Engine, run_id: int, prompts: Sequence[int]) -> list[str]:
    """The ids rows carry for these prompt indexes (the dataset's id, else RUN-INDEX), in order."""
    if not prompts:
        return []
    with engine.connect() as conn:
        name = conn.execute(text("SELECT name FROM run WHERE id = :r"), {"r": run_id}).scalar()
        got: dict[int, str] = {}
        for i in range(0, len(prompts), 500):
            part = ",".join(str(int(p)) for p in prompts[i:i + 500])
            for p, sid in conn.execute(text(
                    f"SELECT COALESCE(prompt_idx, idx), MIN(source_id) FROM record WHERE run_id = :r AND"
                    f" COALESCE(prompt_idx, idx) IN ({part}) GROUP BY COALESCE(prompt_idx, idx)"), {"r": run_id}):
                got[int(p)] = str(sid) if sid not in (None, "") else f"{name}-{p}"
        conn.rollback()
    return [got.get(int(p), f"{name}-{p}") for p in prompts]
