"""Export selection per prompt (#30): all samples, the passing ones, the first passing one, or the best by a
verdict's score.

A run with k samples per prompt has k records per prompt. Before writing, the export reads the run's ok records once
(keyset pages, as the export itself) and keeps those the other exclusions let through (canaries, flags, checks,
versions); among those it picks per prompt by the latest verdict of one check (check_verdict: the verifier by
default, or ``--select-check judge``):

- ``passing``: every sample whose verdict is pass;
- ``first-passing``: the passing sample with the lowest sample index (one record per prompt that passed);
- ``best``: the sample with the highest verdict score (pass counts 1 and fail 0 when a verdict has no score), the
  lowest sample index on a tie.

A record without a pass/fail verdict (pending, or the check's own error) is never dropped silently: it is left out
under ``no_verdict``, counted, and the manifest names how many and the first of them. Memory: the ids of the
eligible records and their verdicts (a few dozen bytes per record).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from ..quality.passk import latest_states_sql, pass_at_k, samples_per_prompt

SELECT_MODES = ("all", "passing", "first-passing", "best")
R_NO_VERDICT = "no_verdict"
R_NOT_SELECTED = "not_selected"
LACKING_SHOWN = 20
# the columns exclusion_reason reads, and the prompt a record belongs to
SELECT_COLS = ("id, idx, COALESCE(prompt_idx, idx) AS prompt_idx, sample_index, reasoning, finish_reason, review,"
               " check_flags, gen_version, derive_version")


@dataclass
class Selection:
    mode: str
    check: str
    keep: set[int] = field(default_factory=set)
    lacking: set[int] = field(default_factory=set)
    prompts: int = 0  # prompts with at least one eligible ok record
    prompts_selected: int = 0
    summary: dict[str, Any] = field(default_factory=dict)

    def reason(self, record_id: int) -> str | None:
        """Why an otherwise exported record is left out by the selection, or None to export it."""
        if record_id in self.keep:
            return None
        return R_NO_VERDICT if record_id in self.lacking else R_NOT_SELECTED


def verdict_map(engine: Engine, run_id: int, check: str) -> dict[int, tuple[str, float | None]]:
    with engine.connect() as conn:
        rows = conn.execute(text(latest_states_sql()), {"r": run_id, "c": check}).all()
        conn.rollback()
    return {int(r[0]): (str(r[1]), None if r[2] is None else float(r[2])) for r in rows}


def select(engine: Engine, run: Mapping[str, Any], mode: str, check: str,
           pages: Any, excluded: Callable[[Mapping[str, Any]], str | None]) -> Selection:
    """Pick the records to export per prompt. ``pages``: the run's ok records (SELECT_COLS) page by page;
    ``excluded(rec)``: the export's other exclusions (a record they leave out is not a candidate)."""
    sel = Selection(mode, check)
    verdicts = verdict_map(engine, int(run["id"]), check)
    best: dict[int, tuple[float, int, int]] = {}  # prompt -> (-score, sample index, id) of the best so far
    chosen: set[int] = set()
    kept_prompts: set[int] = set()
    for page in pages:
        for rec in page:
            if excluded(rec) is not None:
                continue
            rid, prompt, sample = int(rec["id"]), int(rec["prompt_idx"]), int(rec["sample_index"] or 0)
            state, score = verdicts.get(rid, ("", None))
            chosen.add(prompt)
            if state not in ("pass", "fail"):
                sel.lacking.add(rid)
                continue
            if mode == "passing":
                if state == "pass":
                    sel.keep.add(rid)
                    kept_prompts.add(prompt)
                continue
            if mode == "first-passing" and state != "pass":
                continue
            value = score if mode == "best" and score is not None else (1.0 if state == "pass" else 0.0)
            key = (-value, sample, rid) if mode == "best" else (0.0, sample, rid)
            if prompt not in best or key < best[prompt]:
                best[prompt] = key
    if mode in ("first-passing", "best"):
        sel.keep.update(k[2] for k in best.values())
        kept_prompts.update(best)
    sel.prompts = len(chosen)
    sel.prompts_selected = len(kept_prompts)
    k = samples_per_prompt(dict(run))
    with engine.connect() as conn:
        passk = pass_at_k(conn, int(run["id"]), check, k)
        conn.rollback()
    sel.summary = {
        "mode": mode, "check": check, "samples_per_prompt": k, "prompts": sel.prompts,
        "prompts_selected": sel.prompts_selected, "records_selected": len(sel.keep),
        "records_lacking_verdict": len(sel.lacking), "lacking_examples": sorted(sel.lacking)[:LACKING_SHOWN],
        "pass_at_k": passk,
        "note": "per prompt, among the ok records the other exclusions let through, by the latest verdict of the "
                "check; records without a pass/fail verdict are left out under no_verdict (counted, never silently)",
    }
    return sel
