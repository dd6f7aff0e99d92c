"""Human words on the review, record, token and export pages (#28 item 5): a check is named by its catalogue label
(synthwatch/check_catalog.py), never by its identifier; token counts carry their unit."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import httpx
from sqlalchemy import text
from test_export import VARIED, make_run
from test_review import add_record, add_run
from workerkit import wait_for

from synthwatch.check_catalog import BIT, CHECK_NAMES, DEFAULT_RULES


class _Visible(HTMLParser):
    """The text a reader sees: data outside script/style, not attribute values (a title may name the check)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self.skip -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def visible(html: str) -> str:
    p = _Visible()
    p.feed(html)
    return " ".join(p.parts)


def identifiers_in(words: str) -> list[str]:
    return [n for n in CHECK_NAMES if "_" in n and re.search(rf"\b{n}\b", words)]


def test_record_page_names_failing_checks_by_their_labels(engine: Any, live_app: Any) -> None:
    run_id = add_run(engine)
    failing = ("duplicate_output", "think_tags_in_content", "truncated_in_reasoning")
    rid = add_record(engine, run_id, 0, check_flags=sum(BIT[n] for n in failing))
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}", timeout=30).text
    words = visible(html)
    assert identifiers_in(words) == [], identifiers_in(words)
    for n in failing:
        assert DEFAULT_RULES[n].title in words
    failing_mode = visible(httpx.get(f"{srv.url}/runs/{run_id}/sample?mode=failing", timeout=30,
                                     follow_redirects=True).text)
    assert identifiers_in(failing_mode) == [] and DEFAULT_RULES["duplicate_output"].title in failing_mode


def test_export_page_and_job_name_checks_by_their_labels(engine: Any, live_app: Any) -> None:
    run_id = make_run(engine, VARIED)
    srv = live_app()
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        words = visible(c.get(f"/runs/{run_id}/export").text)
        assert identifiers_in(words) == [], identifiers_in(words)  # the issue counted 14 raw names here
        assert DEFAULT_RULES["duplicate_output"].title in words
        job = c.post(f"/api/runs/{run_id}/exports",
                     json={"format": "sharegpt", "exclude_checks": ["duplicate_output", "think_tags_in_content"]}).json()
        wait_for(lambda: c.get(f"/api/runs/{run_id}/exports/{job['id']}").json()["status"] == "done",
                 what="the export")
        page = visible(c.get(f"/runs/{run_id}/exports/{job['id']}").text)
        assert "Checks applied" in page and DEFAULT_RULES["think_tags_in_content"].title in page
        assert identifiers_in(page) == [], identifiers_in(page)


def test_token_view_numbers_carry_their_unit(engine: Any, live_app: Any) -> None:
    run_id = add_run(engine, config={"tokenizer": {"name_or_path": "deepseek-v4"}})
    rid = add_record(engine, run_id, 0, completion_tokens=17)
    with engine.begin() as conn:
        conn.execute(text("UPDATE record SET token_ids_json = :j WHERE id = :i"),
                     {"j": '{"completion": [1, 2, 3]}', "i": rid})
    srv = live_app()
    html = httpx.get(f"{srv.url}/runs/{run_id}/records/{rid}/tokens", timeout=60).text
    summary = " ".join(visible(html.split('<div class="token-summary">')[1].split("</div>")[0]).split())
    counts = summary.split("template ")[1].split(" ", 1)[1]  # past the tokenizer's and the template's names
    numbers = list(re.finditer(r"\d[\d,]*", counts))
    assert len(numbers) >= 7, summary
    for m in numbers:  # every number is followed by its unit
        assert re.match(r" (?:completion )?tokens?\b", counts[m.end():]), (m.group(), summary)
    assert "the server counted 17 completion tokens" in summary
    assert "None" not in visible(html)  # the server's 3 ids end long before the re-tokenized ones: said in words
