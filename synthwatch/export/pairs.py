"""Preference pairs from k samples (#38): ``export --pairs`` writes chosen/rejected rows in TRL's DPO format.

A run with k samples per prompt has, per prompt, samples a check passed and samples it failed. A pair is one
passing sample (chosen) and one failing sample (rejected) of the same prompt, by the checks of ``--select-check``
(any name of the run's catalogue, synthwatch.quality.selection: a verifier, ``judge``, a user check, a rule, a
built-in check; the run's first answer verifier by default; repeated, they combine with AND as in export/select.py:
a sample passes when every one passes, fails when one fails; its score is the first check's); never two passing or
two failing samples. ``--where`` and ``--exclude-check`` restrict the candidates: a sample they leave out is in no
pair. With ``--pair-margin M`` a pair also needs the chosen sample's score to exceed the rejected one's by at
least M (judge scores: confident pairs only; a sample without a score is in no pair).

Per prompt, at most ``--pairs-per-prompt`` P pairs, in a fixed order: passing samples ranked by score (highest
first), failing ones by score (lowest first), then by sample index and record id; first the pairs that share no
sample (best passing with worst failing, second with second, ...), then the rest by rank (or, with a margin, by
the score gap, largest first). The same verdicts give the same file.

Like export/select.py, the eligible records are read once before writing (the export's other exclusions apply
first: canaries, flags, checks, versions). The writing pass then reads the records in id order and writes a
prompt's pairs, in their order, as soon as all their samples have been read; only those samples are held until
then (a prompt's k samples are stored next to each other).

Row, as TRL's conversational preference format (trl.data_utils: ``prompt`` a list of messages ending with the
user's turn; ``chosen`` and ``rejected`` a one-message list each, the assistant's answer): the reasoning is in
``reasoning_content``, the key Hugging Face chat templates read (TRL renders ``prompt + chosen`` through the
template and trains what follows the prompt's render), or inline between the run's think strings with
``--think-inline`` for a template that does not read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy.engine import Engine

from .plan import ExportError, ExportOptions, ExportPlan, normalize_messages, record_id
from .select import LACKING_SHOWN, R_NO_VERDICT, verdict_map

R_NOT_PAIRED = "not_paired"
# why a prompt has no pair, in the order they are tested
NO_PAIR_REASONS = ("pending", "no_pass", "no_fail", "no_score", "no_margin")
PROMPTS_SHOWN = 20


@dataclass(frozen=True)
class Sample:
    id: int
    sample: int
    passed: bool
    score: float | None


def check_options(options: ExportOptions) -> None:
    """ExportError for pair options that do not fit together (before anything is read)."""
    if options.format != "pairs":
        if options.pairs_per_prompt != 1 or options.pair_margin is not None:
            raise ExportError("--pairs-per-prompt and --pair-margin go with --pairs")
        return
    if options.select != "all" or options.require_pass:
        raise ExportError("--pairs makes its own selection (a passing and a failing sample per pair); drop "
                          + ("--select" if options.select != "all" else "--require-pass"))
    if options.turns != "last":
        raise ExportError("--pairs pairs whole answers: it takes --turns last only")
    if options.pairs_per_prompt < 1:
        raise ExportError(f"--pairs-per-prompt must be 1 or more, got {options.pairs_per_prompt}")
    if options.pair_margin is not None and not 0 <= options.pair_margin <= 1e9:
        raise ExportError(f"--pair-margin must be a score difference of 0 or more, got {options.pair_margin}")


def rank_pairs(samples: list[Sample], per_prompt: int, margin: float | None) -> tuple[list[tuple[Sample, Sample]], str]:
    """One prompt's pairs (chosen, rejected), at most ``per_prompt``, in their fixed order; with none, why."""
    passing = sorted((s for s in samples if s.passed), key=lambda s: (-(s.score or 0.0), s.sample, s.id))
    failing = sorted((s for s in samples if not s.passed), key=lambda s: (s.score or 0.0, s.sample, s.id))
    if not passing or not failing:
        return [], "no_pass" if not passing else "no_fail"
    combos: list[tuple[Any, int, int]] = []
    for i, c in enumerate(passing):
        for j, r in enumerate(failing):
            if margin is None:
                combos.append(((i + j, i), i, j))
            elif c.score is not None and r.score is not None and c.score - r.score >= margin:
                combos.append(((r.score - c.score, i, j), i, j))
    if not combos:
        scored = any(s.score is not None for s in passing) and any(s.score is not None for s in failing)
        return [], "no_margin" if scored else "no_score"
    combos.sort()
    chosen: list[tuple[int, int]] = []
    used_c: set[int] = set()
    used_r: set[int] = set()
    for _key, i, j in combos:  # first the pairs that share no sample with another
        if len(chosen) < per_prompt and i not in used_c and j not in used_r:
            chosen.append((i, j))
            used_c.add(i)
            used_r.add(j)
    for _key, i, j in combos:  # then the rest, in the same order
        if len(chosen) < per_prompt and (i, j) not in chosen:
            chosen.append((i, j))
    order = {(i, j): n for n, (_k, i, j) in enumerate(combos)}
    chosen.sort(key=lambda ij: order[ij])
    return [(passing[i], failing[j]) for i, j in chosen], ""


@dataclass
class Pairing:
    """The pairs an export writes, and what the per-record loop of run_export asks of a selection."""

    check: str
    per_prompt: int
    margin: float | None
    inline: bool = False
    pairs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """prompt -> its pairs (chosen id, rejected id) in order"""
    info: dict[int, Sample] = field(default_factory=dict)
    """every sample in a pair"""
    lacking: set[int] = field(default_factory=set)
    no_pair: dict[str, list[int]] = field(default_factory=lambda: {r: [] for r in NO_PAIR_REASONS})
    prompts: int = 0
    waiting: dict[int, tuple[int, dict[str, Any], list[dict[str, Any]]]] = field(default_factory=dict)
    """record id -> (prompt, its answer message, its prompt messages), until its prompt's pairs are written"""
    written: int = 0

    def reason(self, rid: int) -> str | None:
        if rid in self.info:
            return None
        return R_NO_VERDICT if rid in self.lacking else R_NOT_PAIRED

    def take(self, rec: Mapping[str, Any], plan: ExportPlan) -> list[dict[str, Any]]:
        """The pair rows this record completes (the record is in at least one pair)."""
        rid = int(rec["id"])
        prompt = int(rec["prompt_idx"] if rec.get("prompt_idx") is not None else rec["idx"])
        self.waiting[rid] = (prompt, answer_message(rec, plan), normalize_messages(orjson.loads(rec["prompt_json"])))
        pairs = self.pairs.get(prompt, [])
        members = {i for pair in pairs for i in pair}
        if not members <= self.waiting.keys():
            return []  # the prompt's pairs are written, in their order, once all their samples are read
        rows = [self._row(c, r, plan) for c, r in pairs]
        for i in members:
            del self.waiting[i]
        self.written += len(rows)
        return rows

    def _row(self, c: int, r: int, plan: ExportPlan) -> dict[str, Any]:
        _p, chosen, prompt_msgs = self.waiting[c]
        rejected = self.waiting[r][1]
        cs, rs = self.info[c], self.info[r]
        run_name = plan.run["name"]
        return {
            "id": f"{chosen['_id']}>{rejected['_id']}",
            "prompt": prompt_msgs,
            "chosen": [{k: v for k, v in chosen.items() if k != "_id"}],
            "rejected": [{k: v for k, v in rejected.items() if k != "_id"}],
            "pair": {"check": self.check, "run": run_name,
                     "chosen": {"id": chosen["_id"], "record": c, "sample_index": cs.sample, "score": cs.score},
                     "rejected": {"id": rejected["_id"], "record": r, "sample_index": rs.sample, "score": rs.score}},
        }

    @property
    def summary(self) -> dict[str, Any]:
        with_pairs = len(self.pairs)
        return {
            "mode": "pairs", "format": "TRL preference (conversational): prompt, chosen, rejected",
            "check": self.check, "pairs_per_prompt": self.per_prompt, "margin": self.margin,
            "reasoning": "inline between the think strings" if self.inline else "reasoning_content",
            "pairs": sum(len(p) for p in self.pairs.values()), "pairs_written": self.written,
            "records_in_pairs": len(self.info), "prompts": self.prompts, "prompts_with_pairs": with_pairs,
            "prompts_without_pairs": {r: len(v) for r, v in self.no_pair.items()},
            "prompts_without_pairs_examples": {r: sorted(v)[:PROMPTS_SHOWN] for r, v in self.no_pair.items() if v},
            "records_lacking_verdict": len(self.lacking), "lacking_examples": sorted(self.lacking)[:LACKING_SHOWN],
            "rules": "a pair is a passing (chosen) and a failing (rejected) sample of one prompt by the check's latest "
                     "verdict, never two passing or two failing" + (
                         f"; the chosen score exceeds the rejected by at least {self.margin}" if self.margin is not None
                         else "") + "; pending: a sample still without a verdict could have made a pair",
        }


def answer_message(rec: Mapping[str, Any], plan: ExportPlan) -> dict[str, Any]:
    reasoning, content = rec.get("reasoning") or "", rec.get("content") or ""
    msg: dict[str, Any] = {"_id": record_id(rec, plan.run["name"]), "role": "assistant"}
    if plan.options.think_inline:
        from .tokens import shown_by

        close = plan.think_close if shown_by(rec, plan.think_close).closed else ""
        msg["content"] = f"{plan.think_open}{reasoning}{close}{content}" if reasoning else content
    else:
        msg["reasoning_content"] = reasoning
        msg["content"] = content
    return msg


def pair_up(engine: Engine, plan: ExportPlan, bits: Mapping[str, int], pages: Iterable[list[dict[str, Any]]],
            excluded: Callable[[Mapping[str, Any]], str | None]) -> Pairing:
    """Read the eligible records (select.SELECT_COLS pages) and verdicts once; decide every pair. The checks are
    plan.select_checks (catalogue names, as export/select.py reads them): a sample passes when every one passes, fails
    when one fails; its score is the first check's. ``bits``: those of them that are built-in checks, with their
    check_flags bit (pass or fail, no score). ``excluded(rec)``: the export's other exclusions (--where,
    --exclude-check, ...): a record they leave out is in no pair."""
    checks = plan.select_checks
    assert checks
    opts = plan.options
    pairing = Pairing(" and ".join(checks), opts.pairs_per_prompt, opts.pair_margin, opts.think_inline)
    verdicts = {c: verdict_map(engine, int(plan.run["id"]), c) for c in checks if c not in bits}
    per_prompt: dict[int, list[Sample]] = {}
    pending: set[int] = set()
    for page in pages:
        for rec in page:
            if excluded(rec) is not None:
                continue
            rid, prompt = int(rec["id"]), int(rec["prompt_idx"])
            samples = per_prompt.setdefault(prompt, [])
            flags = int(rec.get("check_flags") or 0)
            states = [(("fail" if flags & bits[c] else "pass"), None) if c in bits else verdicts[c].get(rid, ("", None))
                      for c in checks]
            if any(st == "fail" for st, _ in states):
                passed = False
            elif all(st == "pass" for st, _ in states):
                passed = True
            else:
                pairing.lacking.add(rid)
                pending.add(prompt)
                continue
            samples.append(Sample(rid, int(rec["sample_index"] or 0), passed, states[0][1]))
    pairing.prompts = len(per_prompt)
    for prompt in sorted(per_prompt):
        pairs, why = rank_pairs(per_prompt[prompt], opts.pairs_per_prompt, opts.pair_margin)
        if pairs:
            pairing.pairs[prompt] = [(c.id, r.id) for c, r in pairs]
            for c, r in pairs:
                pairing.info[c.id], pairing.info[r.id] = c, r
        else:
            # a sample without a verdict yet could have been the missing side
            pairing.no_pair["pending" if prompt in pending and why in ("no_pass", "no_fail") else why].append(prompt)
    return pairing
