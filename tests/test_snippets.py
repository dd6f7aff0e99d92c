"""Search snippets in the records table: from the field that matched, highlighted, escaped; pending rows."""

from __future__ import annotations

import re

import httpx
from test_review import add_record, add_run

from synthwatch.app.snippets import snippet, terms


def test_snippet_marks_every_word_in_its_window() -> None:
    text = "x " * 100 + "The Quadratic formula: solve quadratics by completing the square."
    pieces = snippet(text, terms("quadratic* square"))
    assert pieces is not None
    assert [t for t, m in pieces if m] == ["Quadratic", "quadratics", "square"]
    assert pieces[0] == ("…", False)  # cut before the match
    assert snippet("nothing here", terms("quadratic")) is None
    assert snippet("aquadratic", terms("quadratic")) is None  # whole words, as the search


def test_records_table_shows_the_matching_field_escaped(live_app, engine) -> None:  # type: ignore[no-untyped-def]
    run_id = add_run(engine)
    add_record(engine, run_id, 0, reasoning="First <script>alert(1)</script> check the zebrafish count.")
    add_record(engine, run_id, 1, status="pending", reasoning=None, content=None)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        html = c.get(f"/runs/{run_id}/records", params={"q": "zebrafish"}).text
        sn = re.search(r'<div class="snippet" data-field="(\w+)">(.*?)</div>', html, re.S)
        assert sn, html[-3000:]
        assert sn.group(1) == "reasoning"
        assert "<mark>zebrafish</mark>" in sn.group(2)
        assert "&lt;script&gt;" in sn.group(2) and "<script>" not in sn.group(2)
        page = c.get(f"/runs/{run_id}/records", params={"status": ""}).text  # any status
        assert "not checked yet" in page  # the pending record was never checked (the default view lists finished records only)
