"""The store's one way in (#34), fuzzed: drawn text, integers and floats written through EVERY table the registry
guards (synthwatch.store.rows.GUARDS), on a real SQLite file and a real PostgreSQL server. A table added to the
registry is covered here without new test code.

Text is drawn to hurt: NUL, lone surrogates, huge values, and a registered API key as is, base64-encoded (standard or
URL-safe, at any offset inside longer bytes, padded or not) and hex-encoded (either case). The invariants:

- no exception escapes a write;
- no row is lost: each row given is written (or its table's refused row stands in for it);
- no secret is stored, in any of the forms above.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from synthwatch.config import RunConfig
from synthwatch.redact import add_secret, encoded_forms, forget_secret
from synthwatch.store import queue as store
from synthwatch.store import rows

KEY = "sk-fuzz-Zq8xW3vN7pL2mK9r"


def secret_texts() -> st.SearchStrategy[str]:
    """Text holding the key in one of the forms a server may echo it in."""
    raw = KEY.encode()
    around = st.binary(max_size=7)
    b64 = st.builds(lambda a, b, url, pad: (base64.urlsafe_b64encode if url else base64.b64encode)(a + raw + b)
                    .decode().rstrip("" if pad else "="), around, around, st.booleans(), st.booleans())
    hexed = st.sampled_from([raw.hex(), raw.hex().upper()])
    form = st.one_of(st.just(KEY), b64, hexed)
    return st.builds(lambda a, f, b: a + f + b, st.text(max_size=20), form, st.text(max_size=20))


def hostile_texts() -> st.SearchStrategy[Any]:
    anything = st.characters(codec=None, exclude_categories=())  # lone surrogates and NUL included
    return st.one_of(
        st.none(),
        st.text(alphabet=anything, max_size=200),
        st.text(alphabet=st.sampled_from(["\x00", "\ud800", "\udfff", "a", " ", "é", "\U0001f600"]), max_size=50),
        secret_texts(),
        st.builds(lambda n, f: "x" * n + f + "y" * n, st.integers(0, 400_000), secret_texts()),  # huge
        st.integers(-(2**70), 2**70),  # not text at all: stored as its str()
    )


def numbers() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))


def forbidden() -> list[str]:
    return [KEY, *encoded_forms(KEY)]


@pytest.fixture
def run_and_record(any_engine: Any) -> tuple[Any, int, int]:
    cfg = RunConfig.model_validate({"name": "fuzz", "dataset": {"path": "x.jsonl"}, "model": "m",
                                    "endpoints": [{"base_url": "http://127.0.0.1:1/v1"}]})
    with any_engine.connect() as conn, store.write_begin(conn):
        run_id = store.create_run(conn, "fuzz", cfg)
        rec = conn.execute(text("INSERT INTO record (run_id, idx, rnd, prompt_json, status, content_null, attempts,"
                                " check_flags)"
                                " VALUES (:r, 0, 0.5, '[]', 'ok', false, 1, 0) RETURNING id"), {"r": run_id}).scalar_one()
    return any_engine, int(run_id), int(rec)


def test_the_registry_names_every_table_and_an_example_row(record_property: Any) -> None:
    names = sorted(rows.GUARDS)
    # printed in the run's summary (tests/conftest.py pytest_terminal_summary), under xdist too
    record_property("coverage", f"store guards: {len(names)} tables ({', '.join(names)}), "
          f"{sum(len(g.texts) for g in rows.GUARDS.values())} text columns, written by "
          f"{sum(len(g.writers) for g in rows.GUARDS.values())} writers; records: workers/record_writes.py")
    assert {"check_verdict", "error_event", "control_event", "alarm", "open_item", "run"} <= set(names)
    for g in rows.GUARDS.values():
        assert g.example is not None and g.writers, g.table
        params = set(re.findall(r"(?<!:):(\w+)", g.sql))
        assert set(g.texts) <= params and set(g.ints) <= params and set(g.floats) <= params, g.table


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_any_value_through_any_guarded_writer_is_stored_without_secrets(run_and_record, data) -> None:  # type: ignore[no-untyped-def]
    engine, run_id, rec = run_and_record
    add_secret(KEY)
    try:
        for g in rows.GUARDS.values():
            assert g.example is not None
            n_rows = data.draw(st.integers(1, 3), label=f"{g.table} rows")
            with engine.connect() as conn, store.write_begin(conn):
                batch = []
                for _ in range(n_rows):
                    row = g.example(conn, run_id, rec)
                    for k in g.texts:
                        row[k] = data.draw(hostile_texts(), label=f"{g.table}.{k}")
                    for k in (*g.ints, *g.floats):
                        row[k] = data.draw(numbers(), label=f"{g.table}.{k}")
                    batch.append(row)
                before = conn.execute(text(f"SELECT count(*) FROM {g.table} WHERE {g.run_column} = :r"),
                                      {"r": run_id}).scalar_one()
                written = rows.write(conn, g.table, batch)  # no exception escapes
                assert len(written) == n_rows, (g.table, written)  # no row lost
                stored = conn.execute(text(f"SELECT * FROM {g.table} WHERE {g.run_column} = :r"), {"r": run_id}).all()
                if g.sql.lstrip().upper().startswith("INSERT"):
                    assert len(stored) == before + n_rows, g.table
            for row in stored:
                for v in row:
                    if isinstance(v, str):
                        assert "\x00" not in v
                        v.encode("utf-8")  # valid UTF-8: no lone surrogate
                        for form in forbidden():
                            assert form not in v, (g.table, form)
    finally:
        forget_secret(KEY)


def test_the_full_text_prefix_is_the_migrations() -> None:
    """store.rows.FTS_PREFIX_CHARS (documented in docs/limits.md) is what migration 0019_store indexes."""
    import importlib.util
    from pathlib import Path

    import synthwatch

    path = Path(synthwatch.__file__).parent / "migrations" / "versions" / "0019_store.py"
    spec = importlib.util.spec_from_file_location("m0018", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.FTS_PREFIX_CHARS == rows.FTS_PREFIX_CHARS
    assert f"left(coalesce(content, ''), {rows.FTS_PREFIX_CHARS})" in mod._function(mod.FTS_PREFIX_CHARS)
    limits = (Path(synthwatch.__file__).parent.parent / "docs" / "limits.md").read_text()
    assert f"the first {rows.FTS_PREFIX_CHARS:,} characters" in limits
