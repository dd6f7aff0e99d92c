"""Exporting a run with an open data-quality alarm needs an explicit yes (#19).

A run paused by an alarm, or still carrying one, holds records the alarm says are bad; exporting it
"as is" is how a team trains on empty reasoning without noticing. The dashboard's export page, the
export API and ``synthwatch export`` therefore name each open alarm (its label, the records failing its
check, where to repair them) and export only once told to anyway: a ticked box, ``allow_open_alarms``,
``--allow-open-alarms``.

Open items count too (#26): an alarm that ended leaves its records failing until they are repaired, flagged
bad or accepted (quality/detection/open_items.py), so an export names each open item and needs the same yes while a
data-quality one is open. Who confirmed, and when, goes into the manifest (``confirmed_with_open_alarms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..hints import command as hint
from ..quality.detection import open_items as items_mod
from ..quality.detection.alarms import TRANSPORT_RULES
from .words import check_label, plural

CONFIRM_FLAG = "--allow-open-alarms"
CONFIRM_FIELD = "allow_open_alarms"


@dataclass
class OpenAlarms:
    run_id: int
    run_name: str
    status: str
    alarms: list[dict[str, Any]] = field(default_factory=list)
    """id, rule, label, title, n_fail (records failing its check, whole run), acked, auto_paused, repair_url"""
    items: list[dict[str, Any]] = field(default_factory=list)
    """the run's open items (quality/detection/open_items.py), data-quality and transport ones"""

    @property
    def quality_items(self) -> list[dict[str, Any]]:
        return [i for i in self.items if not i["transport"]]

    @property
    def blocking(self) -> bool:
        """An export needs a yes: a data-quality alarm or open item is open."""
        return bool(self.alarms or self.quality_items)

    @property
    def paused(self) -> bool:
        return self.status == "paused"

    def lines(self) -> list[str]:
        return [f"{a['label']} (alarm #{a['id']}{', acknowledged' if a['acked'] else ''}): "
                f"{plural(a['n_fail'], 'record')} failing {a['rule']}" for a in self.alarms] + [
                f"open problem #{i['id']}: {i['text']}" for i in self.items]

    def message(self, *, cli: bool) -> str:
        state = " and is paused" if self.paused else ""
        what = [plural(len(self.alarms), "open data-quality alarm")] if self.alarms else []
        if self.items:
            what.append(plural(len(self.items), "open problem"))
        head = (f"run {self.run_name!r} has {' and '.join(what)}{state}; "
                "an export now includes the records they name unless the selection leaves them out:")
        url = (self.alarms[0]["repair_url"] if self.alarms else f"/runs/{self.run_id}/repair#repair")
        accept = (f" accept an open problem ({hint('checks', '--accept', self.items[0]['id'], '--reason', 'why', run=self.run_name)}),"
                  if self.items else "")
        fix = (f"Repair them first (rederive / rerun, docs/repair.md; or the dashboard's {url}), flag"
               f" them bad,{accept}"
               f" or export anyway with {CONFIRM_FLAG}." if cli else
               "Repair them first, flag them bad or accept them on the run page, or tick \"export anyway\".")
        return "\n".join([head, *(f"  - {line}" for line in self.lines()), fix])

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "status": self.status, "paused": self.paused, "alarms": self.alarms,
                "open_items": self.items}


def left_out_by(select: str | None, checks: Sequence[str]) -> tuple[str, ...]:
    """The checks whose failing records an export's per-prompt selection leaves out (export/select.py): --select
    passing or first-passing exports only records that pass its checks, so their alarms do not hold it."""
    return tuple(c for c in checks if c) if select in ("passing", "first-passing") else ()


def left_out_for(options: Any, select_checks: Sequence[str], *, expects_reasoning: bool,
                 also: Sequence[str] = ()) -> tuple[str, ...]:
    """Every check whose failing records an export is told to leave out, so that its alarm and open items do not
    hold it (#35): the per-prompt selection's check (left_out_by) and each ``--exclude-check`` (a record failing
    it has its bit in check_flags, which is what the exclusion reads; an open item's records are those). Only
    checks the person named: the default exclusions, which drop empty reasoning as a matter of course, never
    lift an alarm by themselves. A check the export does not leave out entirely is not listed. Any check name of
    the run's catalogue counts (#38); ``also``: more such checks (the top-level conditions of --where)."""
    out = list(left_out_by(options.select, select_checks))
    for name in (*(n.strip() for n in options.exclude_checks if n.strip()), *also):
        if name == "empty_reasoning" and not expects_reasoning:
            continue  # not applied: the run does not expect reasoning (export/stream.exclusion_reason)
        if name not in out:
            out.append(name)
    return tuple(out)


def open_alarms(conn: Connection, run_id: int, *, left_out: tuple[str, ...] = ()) -> OpenAlarms | None:
    """The run's open (active) data-quality alarms, most failing records first, and its open items; None when
    there are none of either (a guard holding only transport items names them but does not block). ``left_out``:
    checks whose failing records the export leaves out by itself (left_out_by): their alarms and items do not
    count."""
    run = conn.execute(text("SELECT name, status FROM run WHERE id = :r"), {"r": run_id}).first()
    if run is None:
        return None
    accepted = items_mod.accepted_since(conn, run_id)  # an alarm whose records a person accepted waits no more
    rows = conn.execute(text(
        "SELECT a.id, a.rule, a.title, a.acked_at, a.auto_paused, a.raised_at,"
        " COALESCE(s.n_fail, a.count) AS n_fail"
        " FROM alarm a LEFT JOIN check_stat s ON s.run_id = a.run_id AND s.check_name = a.rule"
        " WHERE a.run_id = :r AND a.active ORDER BY a.id"), {"r": run_id}).mappings().all()
    alarms = [{"id": r["id"], "rule": r["rule"], "label": check_label(r["rule"]), "title": r["title"],
               "n_fail": int(r["n_fail"] or 0), "acked": r["acked_at"] is not None,
               "auto_paused": bool(r["auto_paused"]),
               "repair_url": f"/runs/{run_id}/repair?alarm={r['id']}#repair"}
              for r in rows if r["rule"] not in TRANSPORT_RULES and r["rule"] not in left_out
              and not (r["rule"] in accepted and accepted[r["rule"]] >= float(r["raised_at"]))]
    items = [i for i in items_mod.items(conn, run_id) if i.get("check_name") not in left_out]
    if not alarms and not items:
        return None
    alarms.sort(key=lambda a: -a["n_fail"])
    return OpenAlarms(run_id, str(run[0]), str(run[1]), alarms, items)


def manifest_items(items: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The open items as the manifest names them."""
    keys = ("id", "check_name", "alarm_id", "n_records", "n_excluded", "first_t", "last_t", "opened_at", "text")
    return tuple({k: i.get(k) for k in keys} for i in items)
