"""Export selection per prompt (#30, #38): all samples, the passing ones, the first passing one, or the best.

A run with k samples per prompt has k records per prompt. Before writing, the export reads the run's ok records once
(keyset pages, as the export itself) and keeps those the other exclusions let through (canaries, flags, checks,
``--where``, versions); among those it picks per prompt by the checks of ``--select-check`` (any catalogue name,
repeatable; the run's first verifier by default). A sample *passes* when every one of them passes (a built-in check
by its check_flags bit, any other by its latest verdict), *fails* when one of them fails, and otherwise has no
verdict yet:

- ``passing``: every sample that passes;
- ``first-passing``: the passing sample with the lowest sample index (one record per prompt that passed);
- ``best``: per prompt, the sample with the highest score of the first check (pass counts 1 and fail 0 when a
  verdict has no score), among the samples passing the other checks when one does; the lowest sample index on a
  tie. The manifest says per prompt whether the best passed (``best.failed_prompts``); with ``require_pass`` a
  prompt whose best did not pass is left out (its best under ``no_pass``).

A record without a pass/fail verdict (pending, or the check's own error) is never dropped silently: it is left out
under ``no_verdict``, counted, and the manifest names how many and the first of them. Memory: the ids of the
eligible records and their verdicts (a few dozen bytes per record).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..quality.passk import latest_states_sql, pass_at_k, samples_per_prompt

SELECT_MODES = ("all", "passing", "first-passing", "best")
R_NO_VERDICT = "no_verdict"
R_NOT_SELECTED = "not_selected"
R_NO_PASS = "no_pass"
LACKING_SHOWN = 20
PROMPTS_SHOWN = 1000
# the columns exclusion_reason reads, and the prompt a record belongs to
SELECT_COLS = ("id, idx, source_id, COALESCE(prompt_idx, idx) AS prompt_idx, sample_index, reasoning, finish_reason,"
               " review, check_flags, gen_version, derive_version")


@dataclass
class Selection:
    mode: str
    checks: tuple[str, ...]
    keep: set[int] = field(default_factory=set)
    lacking: set[int] = field(default_factory=set)
    no_pass: set[int] = field(default_factory=set)
    prompts: int = 0  # prompts with at least one eligible ok record
    prompts_selected: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    def reason(self, record_id: int) -> str | None:
        """Why an otherwise exported record is left out by the selection, or None to export it."""
        if record_id in self.keep:
            return None
        if record_id in self.no_pass:
            return R_NO_PASS
        return R_NO_VERDICT if record_id in self.lacking else R_NOT_SELECTED


def verdict_map(engine: Engine, run_id: int, check: str) -> dict[int, tuple[str, float | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text(latest_states_sql()), {"r": run_id, "c": check}).all()
        conn.rollback()
    return {int(r[0]): (str(r[1]), None if r[2] is None else float(r[2])) for r in rows}


def _states(rec: Mapping[str, Any], checks: Sequence[str], bits: Mapping[str, int],
            verdicts: Mapping[str, dict[int, tuple[str, float | None]]]) -> list[tuple[str, float | None]]:
    rid, flags = int(rec["id"]), int(rec.get("check_flags") or 0)
    return [(("fail" if flags & bits[c] else "pass"), None) if c in bits else verdicts[c].get(rid, ("", None))
            for c in checks]


def select(engine: Engine, run: Mapping[str, Any], mode: str, checks: Sequence[str], bits: Mapping[str, int],
           pages: Any, excluded: Callable[[Mapping[str, Any]], str | None], *,
           require_pass: bool = False) -> Selection:
    """Pick the records to export per prompt. ``checks``: resolved catalogue names, ``bits``: those of them that are
    built-in checks with their check_flags bit; ``pages``: the run's ok records (SELECT_COLS) page by page;
    ``excluded(rec)``: the export's other exclusions (a record they leave out is not a candidate)."""
    sel = Selection(mode, tuple(checks))
    verdicts = {c: verdict_map(engine, int(run["id"]), c) for c in checks if c not in bits}
    best: dict[int, tuple[int, float, int, int, bool, str]] = {}  # prompt -> key of the best so far, passed, id
    chosen: set[int] = set()
    kept_prompts: set[int] = set()
    for page in pages:
        for rec in page:
            if excluded(rec) is not None:
                continue
            rid, prompt, sample = int(rec["id"]), int(rec["prompt_idx"]), int(rec["sample_index"] or 0)
            states = _states(rec, checks, bits, verdicts)
            chosen.add(prompt)
            if any(s == "fail" for s, _ in states):
                state = "fail"
            elif all(s == "pass" for s, _ in states):
                state = "pass"
            else:
                sel.lacking.add(rid)
                continue
            if mode == "passing":
                if state == "pass":
                    sel.keep.add(rid)
                    kept_prompts.add(prompt)
                continue
            if mode == "first-passing" and state != "pass":
                continue
            first, score = states[0]
            if first not in ("pass", "fail"):  # the first check undecided while another failed: ranks last
                first, score = "fail", None
            value = score if mode == "best" and score is not None else (1.0 if first == "pass" else 0.0)
            others = all(s == "pass" for s, _ in states[1:])
            key = (0 if others else 1, -value, sample, rid, state == "pass", str(rec.get("source_id") or ""))
            if mode != "best":
                key = (0, 0.0, sample, rid, True, "")
            if prompt not in best or key[:4] < best[prompt][:4]:
                best[prompt] = key
    failed_best = sorted((p, k[5]) for p, k in best.items() if not k[4])
    if mode == "best" and require_pass:
        sel.no_pass.update(best[p][3] for p, _ in failed_best)
        for p, _ in failed_best:
            del best[p]
    if mode in ("first-passing", "best"):
        sel.keep.update(k[3] for k in best.values())
        kept_prompts.update(best)
    sel.prompts = len(chosen)
    sel.prompts_selected = len(kept_prompts)
    k = samples_per_prompt(dict(run))
    counted = next((c for c in checks if c not in bits), None)
    with engine.connect() as conn:
        passk = pass_at_k(conn, int(run["id"]), counted, k) if counted else None
        conn.rollback()
    sel.summary = {
        "mode": mode, "check": checks[0], "checks": list(checks), "samples_per_prompt": k, "prompts": sel.prompts,
        "prompts_selected": sel.prompts_selected, "records_selected": len(sel.keep),
        "records_lacking_verdict": len(sel.lacking), "lacking_examples": sorted(sel.lacking)[:LACKING_SHOWN],
        "pass_at_k": passk,
        "note": "per prompt, among the ok records the other exclusions let through, by the latest verdicts of the "
                "checks (a sample passes when every one passes); records without a pass/fail verdict are left out "
                "under no_verdict (counted, never silently)",
    }
    if mode == "best":
        sel.summary["best"] = {
            "require_pass": require_pass, "prompts_best_passed": len(best) - (0 if require_pass else len(failed_best)),
            "prompts_best_failed": len(failed_best), "prompts_left_out": len(failed_best) if require_pass else 0,
            "failed_prompts": [sid or f"{run['name']}-{p}" for p, sid in failed_best[:PROMPTS_SHOWN]],
            "failed_prompts_complete": len(failed_best) <= PROMPTS_SHOWN,
            "note": "per prompt, whether the sample chosen as best passed every check; require_pass leaves out "
                    "the prompts whose best did not (their best counted under no_pass)"}
    return sel
