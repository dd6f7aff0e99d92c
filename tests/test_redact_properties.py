"""Property: whatever the key and however a server echoes it, nothing synthwatch prints, logs, records or returns
holds the key or a piece of 8 characters of it, in any of the forms it was echoed in (#25 items 6 and 7).

Keys are random text of a safe length (any Unicode for redaction and logging; what HTTP can carry for the real
paths). Echoes are raw, JSON-escaped (either escaping), percent-encoded, mojibake (UTF-8 bytes read as Latin-1 or
cp1252), HTML-escaped, Python repr, a piece cut from the key's start or end, cut at a truncation boundary, or
buried in long text. The real paths: redact.clip as the worker cuts errors, a log record through a handler,
the start form's probe button on a live dashboard (the page it answers with) and `probe()` against a server that
echoes the Authorization header, and the worker's HTTP client (the message it records). The number of examples is the Hypothesis profile's ("ci": 25 each; ./dev fuzz: 500).
"""

from __future__ import annotations

import html
import io
import json
import logging
import os
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import run_async
from hypothesis import given
from hypothesis import strategies as st

from synthwatch.config import EndpointConfig, EndpointPoolConfig
from synthwatch.probe import ProbeError, ProbeOptions, probe
from synthwatch.redact import FRAGMENT_CHARS, add_secret, clip, forget_secret, redact, secret_problem
from synthwatch.workers.client import Requester
from synthwatch.workers.endpoints import EndpointPool
from tests.keyecho import FILLER, MODES, KeyEchoServer, leaks

BODY = b'{"model": "m", "stream": false, "messages": [{"role": "user", "content": "hi"}]}'


def _echoes(key: str) -> dict[str, str]:
    out = {
        "raw": key,
        "json": json.dumps(key)[1:-1],
        "json_slash": json.dumps(key)[1:-1].replace("/", "\\/"),
        "json_utf8": json.dumps(key, ensure_ascii=False)[1:-1],
        "json_upper_hex": re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m[1].upper(), json.dumps(key)[1:-1]),
        "url": urllib.parse.quote(key),
        "url_plus": urllib.parse.quote_plus(key),
        "url_lower_hex": re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), urllib.parse.quote(key)),
        "html": html.escape(key),
        "repr": ascii(key)[1:-1],
        "repr_bytes": repr(key.encode("utf-8", "surrogatepass"))[2:-1],
        "upper": key.upper(),
        "lower": key.lower(),
        "swapcase": key.swapcase(),
        "start_cut": key[-FRAGMENT_CHARS - (len(key) - FRAGMENT_CHARS) // 2:],
        "end_cut": key[: FRAGMENT_CHARS + (len(key) - FRAGMENT_CHARS) // 2],
    }
    utf8 = key.encode("utf-8", "surrogatepass")
    for enc in ("latin-1", "cp1252"):
        try:
            out[f"mojibake_{enc}"] = utf8.decode(enc)
        except UnicodeDecodeError:
            pass
    return out


CASED = ("upper", "lower", "swapcase")


def _filler(n: int) -> str:
    return (FILLER * (n // len(FILLER) + 1))[:n]


any_key = st.text(min_size=8, max_size=48).filter(lambda k: len(k.strip()) >= 4)
http_key = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF).filter(lambda c: not 0x7F <= ord(c) < 0xA0),
                   min_size=8, max_size=48).filter(lambda k: secret_problem(k) is None)


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log = logging.getLogger("synthwatch.test_redact_properties")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log, buf
    log.removeHandler(handler)


@given(key=any_key, how=st.sampled_from(sorted(_echoes("sk-placeholder-é/\" x"))), before=st.integers(0, 3000),
       after=st.integers(0, 300), cut=st.integers(0, 80))
def test_no_echo_of_a_key_survives_redaction_clipping_or_logging(logged: Any, key: str, how: str, before: int,
                                                                   after: int, cut: int) -> None:
    echo = _echoes(key).get(how, key)
    text = f"{_filler(before)}Incorrect API key provided: {echo}. {_filler(after)}"
    add_secret(key)
    try:
        assert leaks(key, redact(text)) == [], (how, text)
        if how in CASED:
            assert leaks(echo, redact(text)) == [], (how, text)  # the key as the server re-cased it
        # cut at any point inside or around the echo, as the worker cuts errors to a length: redacted first
        n = len(text) - len(_filler(after)) - 2 - min(cut, len(echo))
        assert leaks(key, clip(text, n)) == [], (how, n)
        log, buf = logged
        buf.seek(0)
        buf.truncate()  # this example's lines only (a failing one leaves its own behind while Hypothesis shrinks)
        log.warning("server said %s", text)
        log.error("reply %r", {"error": {"message": text}})
        assert leaks(key, buf.getvalue()) == [], (how, key)
    finally:
        forget_secret(key)


@pytest.fixture
def dashboard(live_app: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_app().url, timeout=30) as client:  # one client: no TLS setup per example
        yield client


@pytest.fixture(scope="module")
def echo_server() -> Iterator[KeyEchoServer]:
    with KeyEchoServer() as srv:
        yield srv


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the "fuzz" profile's 500 examples take ~6 minutes here; "ci" takes ~20 s
@given(key=http_key, mode=st.sampled_from(MODES), as_json=st.booleans())
def test_no_echo_of_a_key_reaches_the_probe_or_a_recorded_error(echo_server: KeyEchoServer, dashboard: httpx.Client,
                                                                 logged: Any, key: str, mode: str,
                                                                 as_json: bool) -> None:
    echo_server.mode, echo_server.as_json = mode, as_json
    echo_server.seen.clear()
    try:
        # the start form's "Probe the endpoint" button: the page the dashboard answers with
        os.environ["SYNTHWATCH_KEY_PROP"] = key
        page = dashboard.post("/runs/new/probe", data={
            "endpoints": echo_server.url, "model": "m", "api_key_env": "SYNTHWATCH_KEY_PROP", "stream": "on"})
        assert page.status_code == 400 and "answered 401" in page.text, page.text[-2000:]
        assert leaks(key, page.text) == [] and leaks(key, html.unescape(page.text)) == [], mode
        # synthwatch probe / the probe button: the report or the error it shows
        with pytest.raises(ProbeError) as info:
            probe(ProbeOptions(echo_server.url, "m", api_key=key, timeout_s=10))
        shown = str(info.value)
        assert "answered 401" in shown and leaks(key, shown) == [], (mode, shown)
        # the worker: the endpoint as it is built from the environment, one request, the message it records
        os.environ["SW_PROP_KEY"] = key
        pool = EndpointPool([EndpointConfig(base_url=echo_server.url, api_key_env="SW_PROP_KEY")],
                            EndpointPoolConfig())

        async def one() -> Any:
            async with Requester(connect_timeout_s=5, total_timeout_s=20, idle_timeout_s=10) as r:
                return await r.attempt(pool.endpoints[0], BODY, False)

        res = run_async(one())
        assert not res.ok and "401" in res.message, res.message
        for stored in (res.message, res.message[:2000]):  # what results.py stores
            assert leaks(key, stored) == [], (mode, stored[-300:])
        log, buf = logged
        buf.seek(0)
        buf.truncate()
        log.warning("attempt failed: %s", res.message)
        assert leaks(key, buf.getvalue()) == []
        assert echo_server.seen and set(echo_server.seen) == {key}, "the key was sent as it is"
    finally:
        os.environ.pop("SW_PROP_KEY", None)
        os.environ.pop("SYNTHWATCH_KEY_PROP", None)
        forget_secret(key)
