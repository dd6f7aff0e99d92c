"""Every check over the labelled corpus (tests/data/check_corpus/): precision and recall per check.

    .venv/bin/python -m tests.check_corpus                 # print the table
    .venv/bin/python -m tests.check_corpus --write-docs    # write it into docs/checks.md

Each corpus record is a raw server response read the way a run reads it (``extract_response`` with the run's
reasoning mode, then the record as the writer hands it to the checks, ``view_from_outcome``), checked by one
``RecordChecker`` per run in the run's order (duplicates and drift depend on what came before). Runs with a
tokenizer also go through the tokenizer checks (``run_token_job``) on every ok record (a live run samples them).
tests/test_check_corpus.py asserts the numbers; docs/checks.md shows them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "check_corpus"
DOC = ROOT / "docs" / "checks.md"
START, END = "<!-- check-corpus:start -->", "<!-- check-corpus:end -->"


def load() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    runs = json.loads((CORPUS / "runs.json").read_text())
    records = [json.loads(line) for line in (CORPUS / "records.jsonl").read_text().splitlines() if line.strip()]
    return runs, records


@dataclass
class Result:
    record: dict[str, Any]
    fired: set[str]
    applied: set[str]
    details: dict[str, Any] = field(default_factory=dict)
    stored_reasoning: str = ""


def context(name: str, run: dict[str, Any]) -> Any:
    from synthwatch.quality.checks import RunContext

    cfg: dict[str, Any] = {"reasoning": {"mode": run["mode"], "expect": run["expect"]}}
    if run.get("canary_every_n"):
        cfg["checks"] = {"canary": {"every_n": run["canary_every_n"]}}
    if run.get("tokenizer"):
        cfg["tokenizer"] = run["tokenizer"]
    return RunContext.from_config(1, name, cfg)


def check_all(runs: dict[str, dict[str, Any]], records: list[dict[str, Any]], *, tokens: bool = True
              ) -> list[Result]:
    """Every record through the checks of its run, in corpus order."""
    from synthwatch.capture.reasoning import extract_response
    from synthwatch.check_catalog import BIT, CHECK_NAMES
    from synthwatch.quality.checks import RecordChecker, view_from_outcome
    from synthwatch.quality.token_checks import TokenJob, run_token_job, tokenizer_spec

    checkers: dict[str, Any] = {}
    tokenizers: dict[str, Any] = {}
    out: list[Result] = []
    for n, rec in enumerate(records, start=1):
        run = runs[rec["run"]]
        if rec["run"] not in checkers:
            checkers[rec["run"]] = RecordChecker(context(rec["run"], run))
        checker = checkers[rec["run"]]
        ex = None
        if rec["status"] == "ok":
            ex = extract_response(rec["response"], run["mode"], checker.ctx.think_open, checker.ctx.think_close)
        outcome = SimpleNamespace(record_id=n, idx=rec["idx"], status=rec["status"], extracted=ex,
                                  messages=rec["messages"], endpoint=rec["endpoint"])
        view = view_from_outcome(outcome)
        applied, failed, det = checker.check(view)
        res = Result(rec, {c for c in CHECK_NAMES if failed & BIT[c]}, {c for c in CHECK_NAMES if applied & BIT[c]},
                     det, view.reasoning)
        if tokens and ex is not None and run.get("tokenizer"):
            from synthwatch.tokens.tokenizer import load_tokenizer

            key = json.dumps(run["tokenizer"], sort_keys=True)
            if key not in tokenizers:
                tokenizers[key] = load_tokenizer(tokenizer_spec(checker.ctx))
            job = TokenJob(n, rec["messages"], view.reasoning, view.content, view.completion_tokens,
                           template=bool(view.reasoning.strip()), count=True)
            for _rid, name, bad, d in run_token_job(tokenizers[key], job):
                res.applied.add(name)
                if bad:
                    res.fired.add(name)
                    res.details[name] = d
        out.append(res)
    return out


@dataclass
class Score:
    labelled: int = 0
    fired: int = 0
    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float | None:
        return self.tp / self.fired if self.fired else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.labelled if self.labelled else None


def score(results: list[Result]) -> dict[str, Score]:
    from synthwatch.check_catalog import CHECK_NAMES

    scores = {c: Score() for c in CHECK_NAMES}
    for res in results:
        want = set(res.record["expect"])
        for c in CHECK_NAMES:
            s = scores[c]
            s.labelled += c in want
            s.fired += c in res.fired
            s.tp += c in want and c in res.fired
            s.fp += c in res.fired and c not in want
            s.fn += c in want and c not in res.fired
    return scores


def disagreements(results: list[Result]) -> list[str]:
    out = []
    for res in results:
        want = set(res.record["expect"])
        if want != res.fired:
            extra, missing = sorted(res.fired - want), sorted(want - res.fired)
            out.append(f"{res.record['id']}: fired but not labelled {extra}, labelled but not fired {missing}")
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def table(results: list[Result]) -> str:
    scores = score(results)
    runs = {r.record["run"] for r in results}
    lines = [
        f"{len(results)} labelled records in {len(runs)} runs (`tests/data/check_corpus/`); each check over every "
        "record. *labelled*: records that must fail it; *fired*: records it failed; precision = right firings / "
        "firings, recall = right firings / labelled.",
        "",
        "| check | labelled | fired | false positives | missed | precision | recall |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in scores.items():
        lines.append(f"| `{name}` | {s.labelled} | {s.fired} | {s.fp} | {s.fn} | {_pct(s.precision)} | "
                     f"{_pct(s.recall)} |")
    misses = disagreements(results)
    lines += ["", "Where a check and the labels disagree (kept in the corpus on purpose):", ""]
    by_scenario: dict[str, list[str]] = {}
    for res in results:
        want = set(res.record["expect"])
        if want != res.fired:
            sc = res.record["scenario"]
            extra, missing = sorted(res.fired - want), sorted(want - res.fired)
            what = "; ".join(
                ([f"`{', '.join(extra)}` fires although it should not"] if extra else [])
                + ([f"`{', '.join(missing)}` does not fire"] if missing else []))
            by_scenario.setdefault(f"{sc}: {res.record['story']} ({what})", []).append(res.record["id"])
    for text, ids in by_scenario.items():
        lines.append(f"- {len(ids)} × {text}")
    if not misses:
        lines.append("- none")
    return "\n".join(lines) + "\n"


def doc_section() -> str:
    """The table as docs/checks.md holds it (between the markers)."""
    runs, records = load()
    return table(check_all(runs, records))


def write_docs() -> bool:
    text = DOC.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{DOC} has no {START} ... {END} markers")
    head, rest = text.split(START, 1)
    _old, tail = rest.split(END, 1)
    new = f"{head}{START}\n{doc_section()}{END}{tail}"
    changed = new != text
    if changed:
        DOC.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.check_corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("--write-docs", action="store_true", help="write the table into docs/checks.md")
    args = p.parse_args(argv)
    if args.write_docs:
        print(f"{DOC}: {'updated' if write_docs() else 'already up to date'}")
    else:
        sys.stdout.write(doc_section())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
