"""Human words on the run page (#28 item 5): the duration line says what the run is doing, and a per-request rate
carries its unit."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
from sqlalchemy import text
from test_review import add_run


def test_duration_words_follow_the_state(live_app: Any, engine: Any) -> None:
    run_id = add_run(engine, name="words")
    srv = live_app()
    t0 = time.time() - 660
    for status, finished, want in (("running", None, r"· running 11m"),
                                   ("paused", None, r"· 11m(?: 0?\d+s)? since the start, paused now"),
                                   ("completed", t0 + 300, r"· ran 5m(?: 0?\d+s)?, ended ")):
        with engine.begin() as conn:
            conn.execute(text("UPDATE run SET status = :s, started_at = :t, finished_at = :f WHERE id = :r"),
                         {"s": status, "t": t0, "f": finished, "r": run_id})
        page = httpx.get(f"{srv.url}/runs/{run_id}").text
        line = re.search(r'data-testid="run-duration">(.*?)</span>', page, re.S)
        assert line, page[:2000]
        words = " ".join(line.group(1).split())
        assert re.search(want, words), (status, words)
        assert status == "running" or "running" not in words, words


def test_a_paused_run_page_poll_is_answered_not_modified(live_app: Any, engine: Any) -> None:
    """A paused run's stats fragment has nothing moving but its "since the start" duration; shown to the minute,
    the next poll's If-None-Match is answered 304 with no body (it ticked each second before, and a paused run page
    cost ~98 KB per 30 s of its 100 KB budget)."""
    run_id = add_run(engine, name="paused-poll")
    srv = live_app()
    t0 = time.time() - 660 - 25  # 11m 25s: the minute does not turn during this test
    with engine.begin() as conn:
        conn.execute(text("UPDATE run SET status = 'paused', started_at = :t, finished_at = NULL WHERE id = :r"),
                     {"t": t0, "r": run_id})
    with httpx.Client(base_url=srv.url) as client:
        first = client.get(f"/runs/{run_id}/stats")
        assert first.status_code == 200 and "since the start, paused now" in " ".join(first.text.split())
        etag = first.headers["etag"]
        start = time.time()
        while time.time() < start + 1.2:  # past the next whole second, when a seconds count would have changed
            time.sleep(0.2)
        again = client.get(f"/runs/{run_id}/stats", headers={"If-None-Match": etag})
        assert again.status_code == 304, again.text[:2000]
