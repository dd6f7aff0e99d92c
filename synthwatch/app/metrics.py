"""Prometheus exposition of the runs in the database (`GET /metrics` on `synthwatch serve`).

The official client library (prometheus_client) writes the text format; a custom collector reads the
database on each scrape, with a few short indexed queries (the run rows, the time series summed per run,
check counts, active alarms), for the newest :data:`MAX_RUNS` runs. Names follow Prometheus conventions
(`_total` for counters, base units, a `synthwatch_` prefix); every family is documented in docs/metrics.md,
and a test parses the output back with the client's own parser.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..quality import selection, verdicts
from ..store.models import RECORD_STATUSES

MAX_RUNS = 200
# the run row's counters the gauge reads (cancelled records are not exported as a state)
RECORD_STATES = tuple(s for s in RECORD_STATUSES if s != "cancelled")
ATTEMPT_KINDS = {"timeout": "attempt_timeouts", "http_429": "http_429", "http_5xx": "http_5xx",
                 "http_4xx": "http_4xx", "dropped": "dropped", "other": "other_errors"}
TOKEN_KINDS = ("prompt", "completion", "reasoning", "content")

# name -> (type, help): the one list docs/metrics.md documents (a test keeps them in step)
FAMILIES: dict[str, tuple[str, str]] = {
    "synthwatch_run_info": ("gauge", "1 per run, with its status and kind as labels"),
    "synthwatch_run_records": ("gauge", "Records of a run by state (pending, in_flight, ok, error, timeout)"),
    "synthwatch_run_records_target": ("gauge", "The run's target: its cap, or every record of the dataset"),
    "synthwatch_run_concurrency": ("gauge", "The run's concurrency setting"),
    "synthwatch_run_reruns_queued": ("gauge", "Records queued again by a re-run, not generated yet"),
    "synthwatch_run_config_version": ("gauge", "The run's current config version"),
    "synthwatch_requests_finished_total": ("counter", "Records that reached a final state, by outcome"),
    "synthwatch_attempt_failures_total": ("counter", "Failed request attempts (retried or not), by kind"),
    "synthwatch_retries_total": ("counter", "Attempts that were retried"),
    "synthwatch_tokens_total": ("counter", "Tokens of ok records, by kind (prompt, completion, reasoning, content)"),
    "synthwatch_check_failing_records": ("gauge", "Records of the run failing a data-quality check"),
    "synthwatch_check_records": ("gauge", "Records of the run a data-quality check applied to"),
    "synthwatch_alarms_active": ("gauge", "Active alarms of the run, by severity"),
    "synthwatch_check_verdicts": ("gauge", "Records of the run by a check's outcome (pass, fail, error, pending), for "
                                  "every check it knows: built-in, verifier, rule, user, language, near_duplicate, "
                                  "judge"),
}
CHECK_LABEL_MAX = 100  # a check's name in a label: a user check's name comes from a config, a stored one from a row
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def check_label(name: Any) -> str:
    """A check name as a label value: printable, at most CHECK_LABEL_MAX characters (the client escapes quotes,
    backslashes and line ends)."""
    s = _UNPRINTABLE.sub("?", str(name))
    return s if len(s) <= CHECK_LABEL_MAX else s[: CHECK_LABEL_MAX - 1] + "…"


class RunsCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # run id -> (its newest verdict id, its verdicts in force by check and state): a run whose verdicts did not
        # change since the last scrape is not counted again (a finished run's, after its first scrape)
        self._verdicts: dict[int, tuple[int, dict[str, dict[str, int]]]] = {}

    def _verdict_counts(self, conn: Any, run_id: int) -> dict[str, dict[str, int]]:
        top = conn.execute(text("SELECT max(id) FROM check_verdict WHERE run_id = :r"), {"r": run_id}).scalar()
        if top is None:
            return {}
        hit = self._verdicts.get(run_id)
        if hit is not None and hit[0] == int(top):
            return hit[1]
        counts = verdicts.state_counts(conn, run_id)
        self._verdicts[run_id] = (int(top), counts)
        return counts

    def describe(self) -> list[Metric]:
        return []  # collected fresh on every scrape

    def collect(self) -> Iterator[Metric]:
        fam: dict[str, Any] = {}
        for name, (kind, help_text) in FAMILIES.items():
            if name == "synthwatch_run_info":
                labels = ["run", "run_id", "status", "kind"]
            elif name in ("synthwatch_run_records",):
                labels = ["run", "run_id", "state"]
            elif name == "synthwatch_requests_finished_total":
                labels = ["run", "run_id", "outcome"]
            elif name == "synthwatch_attempt_failures_total":
                labels = ["run", "run_id", "kind"]
            elif name == "synthwatch_tokens_total":
                labels = ["run", "run_id", "kind"]
            elif name == "synthwatch_check_verdicts":
                labels = ["run", "run_id", "check", "kind", "verdict"]
            elif name.startswith("synthwatch_check_"):
                labels = ["run", "run_id", "check"]
            elif name == "synthwatch_alarms_active":
                labels = ["run", "run_id", "severity"]
            else:
                labels = ["run", "run_id"]
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            fam[name] = cls(name, help_text, labels=labels)
        with self.engine.connect() as conn:
            runs = conn.execute(text(
                "SELECT id, name, kind, status, cap, concurrency, total, n_pending, n_in_flight, n_ok, n_error,"
                " n_timeout, n_rerun, config_version, config_json FROM run ORDER BY id DESC LIMIT :n"), {"n": MAX_RUNS}).mappings().all()
            ids = [int(r["id"]) for r in runs]
            sums: dict[int, Any] = {}
            checks: dict[int, list[Any]] = {}
            alarms: dict[int, dict[str, int]] = {}
            cats: dict[int, selection.Catalogue] = {}
            states: dict[int, dict[str, dict[str, int]]] = {}
            if ids:
                lo = min(ids)
                for row in conn.execute(text(
                        "SELECT run_id, SUM(ok), SUM(errors), SUM(timeouts), SUM(attempt_timeouts), SUM(http_429),"
                        " SUM(http_5xx), SUM(http_4xx), SUM(dropped), SUM(other_errors), SUM(retries),"
                        " SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), SUM(content_tokens)"
                        " FROM series WHERE run_id >= :lo GROUP BY run_id"), {"lo": lo}):
                    sums[int(row[0])] = row
                for run_id, name, n_fail, n_total in conn.execute(text(
                        "SELECT run_id, check_name, n_fail, n_total FROM check_stat WHERE run_id >= :lo"), {"lo": lo}):
                    checks.setdefault(int(run_id), []).append((name, n_fail, n_total))
                for run_id, severity, n in conn.execute(text(
                        "SELECT run_id, severity, COUNT(*) FROM alarm WHERE active AND run_id >= :lo"
                        " GROUP BY run_id, severity"), {"lo": lo}):
                    alarms.setdefault(int(run_id), {})[severity] = int(n)
                for r in runs:
                    rid = int(r["id"])
                    cats[rid] = selection.catalogue_of(r["config_json"], selection.stored_names(conn, rid))
                    states[rid] = self._verdict_counts(conn, rid)
                for gone in set(self._verdicts) - set(ids):
                    del self._verdicts[gone]
            conn.rollback()
        for r in runs:
            rid = int(r["id"])
            lab = [str(r["name"]), str(rid)]
            fam["synthwatch_run_info"].add_metric([*lab, str(r["status"]), str(r["kind"])], 1)
            counts = {"pending": r["n_pending"], "in_flight": r["n_in_flight"], "ok": r["n_ok"],
                      "error": r["n_error"], "timeout": r["n_timeout"]}
            for state in RECORD_STATES:
                fam["synthwatch_run_records"].add_metric([*lab, state], int(counts[state] or 0))
            fam["synthwatch_run_records_target"].add_metric(lab, int(r["cap"] if r["cap"] is not None else r["total"] or 0))
            fam["synthwatch_run_concurrency"].add_metric(lab, int(r["concurrency"] or 0))
            fam["synthwatch_run_reruns_queued"].add_metric(lab, int(r["n_rerun"] or 0))
            fam["synthwatch_run_config_version"].add_metric(lab, int(r["config_version"] or 1))
            s = sums.get(rid)
            v = [float(x or 0) for x in s[1:]] if s is not None else [0.0] * 14
            for outcome, value in zip(("ok", "error", "timeout"), v[0:3], strict=True):
                fam["synthwatch_requests_finished_total"].add_metric([*lab, outcome], value)
            for kind, value in zip(ATTEMPT_KINDS, v[3:9], strict=True):
                fam["synthwatch_attempt_failures_total"].add_metric([*lab, kind], value)
            fam["synthwatch_retries_total"].add_metric(lab, v[9])
            for kind, value in zip(TOKEN_KINDS, v[10:14], strict=True):
                fam["synthwatch_tokens_total"].add_metric([*lab, kind], value)
            for name, n_fail, n_total in checks.get(rid, ()):
                fam["synthwatch_check_failing_records"].add_metric([*lab, str(name)], int(n_fail or 0))
                fam["synthwatch_check_records"].add_metric([*lab, str(name)], int(n_total or 0))
            for severity in ("error", "warning"):
                fam["synthwatch_alarms_active"].add_metric([*lab, severity], alarms.get(rid, {}).get(severity, 0))
            self._add_verdicts(fam["synthwatch_check_verdicts"], lab, r, cats.get(rid), checks.get(rid, ()),
                               states.get(rid, {}))
        yield from fam.values()

    @staticmethod
    def _add_verdicts(family: Any, lab: list[str], run: Any, cat: selection.Catalogue | None, stats: Any,
                      states: dict[str, dict[str, int]]) -> None:
        """Every check of the run's catalogue by outcome: a built-in check's pass and fail from its running totals
        (check_stat, as the checks page); a stored verdict's (verifier, rule, user, language, near_duplicate, judge)
        pass, fail, error and pending from the verdicts in force, pending counting the ok records with none yet."""
        if cat is None:
            return
        totals = {str(name): (int(n_fail or 0), int(n_total or 0)) for name, n_fail, n_total in stats}
        n_ok = int(run["n_ok"] or 0)
        for entry in cat.entries.values():
            name = check_label(entry.name)
            if entry.kind == selection.BUILTIN:
                if entry.name not in totals:
                    continue  # not computed for this run (yet)
                n_fail, n_total = totals[entry.name]
                family.add_metric([*lab, name, entry.kind, "pass"], max(0, n_total - n_fail))
                family.add_metric([*lab, name, entry.kind, "fail"], n_fail)
                continue
            got = states.get(entry.name, {})
            answered = sum(got.get(s, 0) for s in ("pass", "fail", "error"))
            for state in ("pass", "fail", "error"):
                family.add_metric([*lab, name, entry.kind, state], got.get(state, 0))
            family.add_metric([*lab, name, entry.kind, "pending"], max(got.get("pending", 0), n_ok - answered))
