"""The check catalogue and selection expressions (#38): one catalogue of names with "did you mean", the grammar, and
the SQL a parsed expression gives, equal to a plain-Python evaluation of the same expression over real rows in a
real SQLite file and a real PostgreSQL database (property test), plus named cases and errors."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.check_catalog import BIT, CHECK_NAMES
from synthwatch.quality import selection as sel
from synthwatch.quality import verdicts as vd
from synthwatch.review.filters import clause_sql
from synthwatch.sources.datasets import Prompt
from synthwatch.store import queue as store

CONFIG: dict[str, Any] = {
    "checks": {
        "verifiers": [{"kind": "math"}],
        "user": [{"name": "boxed", "function": "mod:fn"}],
        "rule": [{"name": "has_boxed", "regex": "boxed"}],
        "language": {"enabled": True},
        "near_duplicate": {"enabled": True},
    },
    "judge": {"model": "j", "base_url": "http://127.0.0.1:1/v1"},
}
EXTENDED = ("verify_math", "user:boxed", "rule:has_boxed", "language", "near_duplicate", "judge")


def cat() -> sel.Catalogue:
    return sel.catalogue_of(CONFIG)


# ------------------------------------------------------------------------------------------- catalogue


def test_the_catalogue_names_every_kind_of_check() -> None:
    c = cat()
    assert c.names[: len(CHECK_NAMES)] == CHECK_NAMES
    assert set(EXTENDED) <= set(c.names) and set(c.extended) == set(EXTENDED)
    kinds = {n: c.entries[n].kind for n in EXTENDED}
    assert kinds == {"verify_math": "verifier", "user:boxed": "user", "rule:has_boxed": "rule",
                     "language": "language", "near_duplicate": "near_duplicate", "judge": "judge"}
    assert c.resolve("verify:math") == "verify_math" and c.resolve("VERIFY_MATH") == "verify_math"
    assert c.entries["language"].outcomes == ("pass", "fail", "pending", "error")
    assert c.entries["truncated"].outcomes == ("pass", "fail") and c.entries["truncated"].bit == BIT["truncated"]
    # a run without extended checks knows the built-in ones only; a check removed from the settings but with
    # verdicts stored is still known
    plain = sel.catalogue_of({}, stored=["user:old", "verify_exact"])
    assert "language" not in plain and "user:old" in plain and plain.resolve("verify:exact") == "verify_exact"
    assert not plain.entries["user:old"].configured


def test_an_unknown_name_says_where_it_came_from_and_did_you_mean() -> None:
    c = cat()
    with pytest.raises(sel.UnknownCheck) as e:
        c.resolve("langauge", source="--exclude-check")
    msg = str(e.value)
    assert "'langauge'" in msg and "(--exclude-check)" in msg and "did you mean 'language'?" in msg
    assert "user:boxed" in msg and "empty_reasoning" in msg and "\n" not in msg
    assert isinstance(e.value, ValueError) and e.value.suggestion == "language"
    with pytest.raises(sel.UnknownCheck, match="did you mean 'user:boxed'"):
        c.resolve("user:boxd")
    with pytest.raises(sel.UnknownCheck) as e2:
        c.resolve("zzzzzz")
    assert "did you mean" not in str(e2.value) and "known checks:" in str(e2.value)


def test_catalogue_of_a_run_reads_its_settings_and_its_stored_verdicts(any_engine) -> None:  # type: ignore[no-untyped-def]
    with any_engine.begin() as conn:
        run_id = store.create_run(conn, "cat", None, snapshot=CONFIG)
        store.insert_prompts(conn, run_id, [Prompt(0, 1, "a", [{"role": "user", "content": "q"}])])
        rid = conn.execute(text("SELECT id FROM record WHERE run_id = :r"), {"r": run_id}).scalar_one()
        vd.append(conn, [vd.NewVerdict(run_id, rid, name, vd.Verdict("pass"))
                         for name in ("user:gone", "rule:gone", "aaa", "zzz")])
    with any_engine.connect() as conn:
        c = sel.catalogue(conn, run_id)
        assert sel.stored_names(conn, run_id) == ["aaa", "rule:gone", "user:gone", "zzz"]
    assert set(EXTENDED) | {"user:gone", "rule:gone", "aaa", "zzz"} <= set(c.names)
    assert c.entries["user:gone"].kind == "user" and c.entries["aaa"].kind == "stored"


# ------------------------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(("src", "normal"), [
    ("verify:math=pass and language=pass and not near_duplicate",
     "verify_math=pass and language=pass and not near_duplicate=fail"),
    ("user:boxed", "user:boxed=fail"),
    ("NOT user:boxed OR truncated AND judge=Pass", "not user:boxed=fail or truncated=fail and judge=pass"),
    ("(not user:boxed or truncated) and judge = pass", "(not user:boxed=fail or truncated=fail) and judge=pass"),
    ("not (language or near_duplicate)", "not (language=fail or near_duplicate=fail)"),
    ("language != pending", "not language=pending"),
    ("((((rule:has_boxed=error))))", "rule:has_boxed=error"),
    ("verify_math=fail and(language)", "verify_math=fail and language=fail"),
    ("not not judge", "not not judge=fail"),
    ("empty_reasoning or truncated or language=pending", "empty_reasoning=fail or truncated=fail or language=pending"),
])
def test_expressions_parse_to_their_normal_form(src: str, normal: str) -> None:
    w = sel.parse_where(src, cat())
    assert w.text == normal
    assert sel.parse_where(w.text, cat()).text == normal  # the normal form parses back to itself


def test_precedence_not_then_and_then_or() -> None:
    w = sel.parse_where("language or truncated and not judge", cat())
    assert isinstance(w.node, sel.Or) and isinstance(w.node.items[1], sel.And)
    assert isinstance(w.node.items[1].items[1], sel.Not)
    assert w.names == ("language", "truncated", "judge") and w.verdict_names == ("language", "judge")


@pytest.mark.parametrize(("src", "needles"), [
    ("verify:math=pass and langauge=pass", ["unknown check 'langauge' at column 22", "did you mean 'language'?"]),
    ("user:boxd", ["did you mean 'user:boxed'?", "at column 1"]),
    ("language=passed", ["unknown outcome 'passed'", "pass, fail, pending, error", "at column 10"]),
    ("truncated=pending", ["built-in check 'truncated'", "pass and fail", "at column 11"]),
    ("language and", ["ends too early"]),
    ("language judge", ["unexpected 'judge' at column 10", "'and', 'or' or ')' expected"]),
    ("(language or judge", ["ends too early"]),
    ("language)", ["unexpected ')' at column 9"]),
    ("language = pass & judge", ["unexpected character '&' at column 17"]),
    ("", ["empty expression"]),
    ("   ", ["empty expression"]),
    ("and", ["unexpected 'and' at column 1"]),
])
def test_bad_expressions_name_what_and_where(src: str, needles: list[str]) -> None:
    with pytest.raises(sel.WhereError) as e:
        sel.parse_where(src, cat(), source="--where")
    msg = str(e.value)
    assert msg.startswith("--where: ") and "\n" not in msg
    for n in needles:
        assert n in msg, msg


def test_check_is_and_the_combinators() -> None:
    c = cat()
    assert sel.check_is(c, "verify:math", "pass").text == "verify_math=pass"
    assert sel.check_is(c, "language").text == "language=fail"
    with pytest.raises(sel.WhereError, match="pass and fail"):
        sel.check_is(c, "truncated", "pending")
    with pytest.raises(sel.UnknownCheck, match=r"\(--select-check\); did you mean 'judge'"):
        sel.check_is(c, "jugde", "pass", source="--select-check")
    both = sel.all_of(sel.check_is(c, "language", "pass"), sel.negate(sel.check_is(c, "near_duplicate")))
    assert both.text == "language=pass and not near_duplicate=fail"
    assert sel.any_of(both, sel.check_is(c, "judge", "pass")).text == (
        "language=pass and not near_duplicate=fail or judge=pass")
    assert sel.all_of(sel.any_of(sel.check_is(c, "judge"), sel.check_is(c, "truncated")), both).text == (
        "(judge=fail or truncated=fail) and language=pass and not near_duplicate=fail")
    assert sel.TRUE.evaluate(0, {}) and not sel.FALSE.evaluate(0, {})


# ------------------------------------------------------------------------------------------- SQL = Python

STATE_LISTS = st.lists(st.sampled_from(vd.STATES), max_size=3)  # appended in order: the last one is in force


@st.composite
def rows(draw: Any) -> list[tuple[int, dict[str, list[str]]]]:
    n = draw(st.integers(1, 12))
    return [(draw(st.integers(0, (1 << len(CHECK_NAMES)) - 1)),
             {name: draw(STATE_LISTS) for name in EXTENDED}) for _ in range(n)]


def atoms() -> st.SearchStrategy[tuple[Any, ...]]:
    c = cat()
    names = [*CHECK_NAMES, *EXTENDED]
    return st.sampled_from(names).flatmap(lambda n: st.tuples(
        st.just("atom"), st.just(n), st.sampled_from(c.entries[n].outcomes),
        st.sampled_from(["eq", "ne", "bare", "alias", "upper"])))


EXPRS = st.recursive(
    atoms(),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), st.lists(inner, min_size=2, max_size=4), st.booleans())),
    max_leaves=12)


def surface(e: tuple[Any, ...], rnd: random.Random) -> str:
    """The expression written as a person might: any case for keywords, aliases, bare names, != and spare
    parentheses. Composite children are parenthesised, so the structure is the tuple's."""
    def kw(s: str) -> str:
        return s.upper() if rnd.random() < 0.3 else s.capitalize() if rnd.random() < 0.3 else s

    if e[0] == "atom":
        _, name, outcome, style = e
        shown = "verify:math" if name == "verify_math" and style == "alias" else name
        if style == "bare" and outcome == "fail":
            return shown
        if style == "ne":  # a built-in check has two outcomes: x=fail is x != pass; else not (x != outcome)
            if name in BIT:
                return f"{shown} != {'pass' if outcome == 'fail' else 'fail'}"
            return f"{kw('not')} {shown} != {outcome}"
        return f"{shown}={outcome.upper() if style == 'upper' else outcome}"
    if e[0] == "not":
        return f"{kw('not')} ({surface(e[1], rnd)})"
    op, items, spare = e
    body = f" {kw(op)} ".join(f"({surface(i, rnd)})" if i[0] in ("and", "or") else surface(i, rnd) for i in items)
    return f"({body})" if spare else body


def truth(e: tuple[Any, ...], flags: int, latest: dict[str, str]) -> bool:
    """The test's own evaluation of the tuple, independent of selection.py."""
    if e[0] == "atom":
        _, name, outcome, _style = e
        if name in BIT:
            return ("fail" if flags & BIT[name] else "pass") == outcome
        return latest.get(name, "pending") == outcome
    if e[0] == "not":
        return not truth(e[1], flags, latest)
    results = [truth(i, flags, latest) for i in e[1]]
    return all(results) if e[0] == "and" else any(results)


RUN_NAMES = itertools.count()  # Hypothesis seeds `random`: names from a counter


def load(engine: Any, data: list[tuple[int, dict[str, list[str]]]]) -> tuple[int, list[int]]:
    with engine.begin() as conn:
        run_id = store.create_run(conn, f"p{next(RUN_NAMES)}", None, snapshot=CONFIG)
        store.insert_prompts(conn, run_id, [Prompt(i, i + 1, None, [{"role": "user", "content": "q"}])
                                            for i in range(len(data))])
        ids = [int(r[0]) for r in conn.execute(text("SELECT id FROM record WHERE run_id = :r ORDER BY idx"),
                                               {"r": run_id})]
        for rid, (flags, states) in zip(ids, data, strict=True):
            conn.execute(text("UPDATE record SET check_flags = :f, status = 'ok' WHERE id = :i"),
                         {"f": flags, "i": rid})
            for depth in range(3):  # interleaved so that "the latest row wins" is tested by id, not by order
                vd.append(conn, [vd.NewVerdict(run_id, rid, n, vd.Verdict(s[depth]))
                                 for n, s in states.items() if len(s) > depth])
    return run_id, ids


@given(data=rows(), expr=EXPRS, seed=st.integers(0, 2**16))
def test_sql_selection_equals_python_evaluation(any_engine, data, expr, seed) -> None:  # type: ignore[no-untyped-def]
    rnd = random.Random(seed)
    src = surface(expr, rnd)
    where = sel.parse_where(src, cat())
    run_id, ids = load(any_engine, data)
    want = [rid for rid, (flags, states) in zip(ids, data, strict=True)
            if truth(expr, flags, {n: s[-1] for n, s in states.items() if s})]
    with any_engine.connect() as conn:
        got = sel.record_ids(conn, run_id, where)
        negated = sel.record_ids(conn, run_id, sel.negate(where))
        again = sel.record_ids(conn, run_id, sel.parse_where(where.text, cat()))
        # the same clause inside a hand-written query, as the records filter renders it (values bound, never inlined)
        r = sel.RECORD.alias("r")
        params: dict[str, Any] = {"run": run_id}
        cond = clause_sql(conn, r, sel.where_clause(where, r), params)
        by_text = [int(row[0]) for row in conn.execute(text(
            f"SELECT r.id FROM record r WHERE r.run_id = :run AND ({cond}) ORDER BY r.id"), params)]
    assert got == want, (src, where.text)
    assert sorted(got + negated) == ids  # never NULL: NOT selects exactly the rest
    assert again == got == by_text  # the normal form selects the same records, and so does the SQL text
    assert [rid for rid, (flags, states) in zip(ids, data, strict=True)
            if where.evaluate(flags, {n: s[-1] for n, s in states.items() if s})] == want


# ------------------------------------------------------------------------------- the export on both backends


def test_an_export_by_expression_and_best_on_sqlite_and_postgresql(any_engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The export's criteria (export/criteria.py) and per-prompt choice over the same stored verdicts on each
    backend: 3 prompts of 2 samples; verdicts appended as the checks append them (the latest row wins)."""
    import json

    from synthwatch.export.plan import ExportOptions
    from synthwatch.export.stream import export_run

    cfg = {"samples_per_prompt": 2, "checks": {"verifiers": [{"kind": "math"}], "language": {"enabled": True}}}
    math = {(0, 0): "pass", (0, 1): "fail", (1, 0): "fail", (1, 1): "fail", (2, 0): "fail", (2, 1): "pass"}
    lang = {(0, 0): "pass", (0, 1): "pass", (1, 0): "pass", (1, 1): "fail", (2, 0): "pass", (2, 1): "pending"}
    with any_engine.begin() as conn:
        run_id = store.create_run(conn, "both", None, snapshot=cfg)
        store.insert_prompts(conn, run_id, [Prompt(p, p + 1, f"q{p}", [{"role": "user", "content": "q"}])
                                            for p in range(3)], samples=2)
        ids = {(int(p), int(s)): int(i) for i, p, s in conn.execute(text(
            "SELECT id, prompt_idx, sample_index FROM record WHERE run_id = :r"), {"r": run_id})}
        conn.execute(text("UPDATE record SET status = 'ok', reasoning = 'r', content = 'c', finish_reason = 'stop',"
                          " finished_at = 1 WHERE run_id = :r"), {"r": run_id})
        vd.append(conn, [vd.NewVerdict(run_id, ids[k], "verify_math", vd.Verdict("error")) for k in ids])
        vd.append(conn, [vd.NewVerdict(run_id, ids[k], "verify_math", vd.Verdict(math[k])) for k in ids])
        vd.append(conn, [vd.NewVerdict(run_id, ids[k], "language", vd.Verdict(lang[k])) for k in ids])

    def export(**opts: Any) -> tuple[list[str], dict[str, Any]]:
        out = tmp_path / f"e{len(list(tmp_path.iterdir()))}.jsonl"
        m = export_run(any_engine, run_id, ExportOptions(format="messages", out=out, **opts))
        return sorted(json.loads(line)["id"] for line in out.read_text().splitlines()), m

    rows, m = export(where="verify:math=pass and not language")
    assert rows == ["q0", "q2#s1"]
    assert m["selection"]["prompts"] == {**m["selection"]["prompts"], "selected": 2, "no_pass": 1, "pending": 0}
    rows, m = export(where="language", exclude_checks=("verify_math",))
    assert rows == [] and m["counts"]["excluded"] == {"check:verify_math": 4, "where": 2}
    rows, m = export(select="best", select_checks=("verify:math",), require_pass=True)
    assert rows == ["q0", "q2#s1"] and m["selection"]["per_prompt"]["best"]["failed_prompts"] == ["q1"]
    rows, m = export(select="passing", select_checks=("verify:math", "language"))
    assert rows == ["q0"] and m["selection"]["prompts"]["pending"] == 1  # q2#s1 waits for language
