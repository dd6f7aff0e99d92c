"""Secrets never leave, on every path that reads a key (#25): the start form's probe button, `synthwatch probe`,
the start form and POST /api/runs, `synthwatch run`, and what a worker records of a server that echoes the key.

The reproductions from the issue: the probe button sent the dashboard's HOME as a bearer token (no allowlist);
`synthwatch probe` printed a key a server echoed, printed a key with a newline inside an error and died with a
UnicodeEncodeError traceback on a zero-width space; a key echoed at the 2,000-character cut was stored minus its
end; a Latin-1 key echoed as mojibake was stored in full; keys under 4 characters were neither refused nor
redacted. Everything runs against a real server that echoes the key (tests/keyecho.py) and a real dashboard.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import cli_env, run_cli, write_prompts

from tests.keyecho import KeyEchoServer, leaks

KEY = "sk-tést-clé-5f0c9e21d4b3a7"  # Latin-1 letters: sent as UTF-8, echoed back as mojibake by a naive server


def _form(url: str, **extra: str) -> dict[str, str]:
    return {"dataset": "", "endpoints": url, "model": "sim-reasoner", "reasoning_mode": "auto", "stream": "on",
            **extra}


def test_the_probe_button_obeys_the_key_allowlist(live_app: Any, monkeypatch: Any) -> None:
    """api_key_env=HOME used to send the dashboard's HOME to the form's URL as a bearer token and show it."""
    monkeypatch.setenv("SYNTHWATCH_KEY_PROBE", KEY)
    monkeypatch.setenv("SYNTHWATCH_KEY_SHORT", "sk-1234")
    monkeypatch.delenv("SYNTHWATCH_KEY_UNSET", raising=False)
    srv = live_app()
    with KeyEchoServer("raw") as echo, httpx.Client(base_url=srv.url, timeout=60) as c:
        for name in ("HOME", "PATH", "SYNTHWATCH_AUTH_TOKEN"):
            r = c.post("/runs/new/probe", data=_form(echo.url, api_key_env=name))
            assert r.status_code == 400 and "may not be used from the dashboard" in r.text, name
            assert f"Bearer {os.environ.get(name, '')}" not in r.text
        for name, why in (("SYNTHWATCH_KEY_SHORT", "fewer than 8 characters"),
                          ("SYNTHWATCH_KEY_UNSET", "is not set")):
            r = c.post("/runs/new/probe", data=_form(echo.url, api_key_env=name))
            assert r.status_code == 400 and name in r.text and why in r.text, r.text[-3000:]
            assert "sk-1234" not in r.text
        assert echo.seen == [], "a refused probe sent nothing"
        # an allowed variable: the key is sent, and the server's echo of it is not shown
        for mode in ("raw", "json", "mojibake", "cut_short"):
            echo.mode = mode
            r = c.post("/runs/new/probe", data=_form(echo.url, api_key_env="SYNTHWATCH_KEY_PROBE"))
            assert r.status_code == 400 and "answered 401" in r.text and "[redacted]" in r.text, (mode, r.text[-3000:])
            assert leaks(KEY, r.text) == [], mode
        assert echo.seen and set(echo.seen) == {KEY}


@pytest.mark.slow
def test_probe_cli_never_prints_an_echoed_key(tmp_path: Path) -> None:
    with KeyEchoServer() as echo:
        for mode in ("raw", "json", "url", "mojibake", "html", "cut_short", "at_cut"):
            echo.mode = mode
            for as_json in (True, False):
                echo.as_json = as_json
                proc = run_cli("probe", "--base-url", echo.url, "--model", "m", "--api-key-env", "SW_PROBE_KEY",
                               "--timeout", "10", env=cli_env(SW_PROBE_KEY=KEY))
                out = proc.stdout + proc.stderr
                assert proc.returncode == 2 and "answered 401" in proc.stderr, (mode, out)
                assert "Traceback" not in out and leaks(KEY, out) == [], (mode, as_json, out)
        assert set(echo.seen) == {KEY}


@pytest.mark.parametrize(("value", "why"), [
    ("sk-abc\nX-Evil: 1-0123456", "a line break"),
    ("sk-live-\u200b4f1c2d3e5a6b7c8d", "U+200B (ZERO WIDTH SPACE)"),
    ("sk-1234", "fewer than 8 characters"),
    (" sk-0123456789", "white space at its start or end"),
])
def test_probe_cli_refuses_a_key_http_cannot_carry_in_one_line(value: str, why: str) -> None:
    with KeyEchoServer() as echo:
        proc = run_cli("probe", "--base-url", echo.url, "--model", "m", "--api-key-env", "SW_PROBE_KEY",
                       env=cli_env(SW_PROBE_KEY=value))
        assert echo.seen == []
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("synthwatch probe: error: environment variable SW_PROBE_KEY"), lines
    assert why in lines[0]
    for piece in (value.strip(), "sk-abc", "4f1c2d3e", "sk-1234"):
        assert piece not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_run_refuses_a_short_key_at_start_up(tmp_path: Path) -> None:
    proc = run_cli("run", "--dataset", str(write_prompts(tmp_path / "p.jsonl", 2)), "--base-url",
                   "http://127.0.0.1:9/v1", "--model", "m", "--db", str(tmp_path / "k.db"), "--api-key-env",
                   "SW_SHORT_KEY", "--quiet", env=cli_env(SW_SHORT_KEY="abc"))
    assert proc.returncode == 2 and "SW_SHORT_KEY holds fewer than 8 characters" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_start_form_and_api_refuse_unusable_key_variables(live_app: Any, monkeypatch: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_prompts(data / "p.jsonl", 2)
    monkeypatch.setenv("SYNTHWATCH_KEY_SHORT", "abc")
    monkeypatch.setenv("SYNTHWATCH_KEY_NL", "sk-0123456789\nX: y")
    monkeypatch.delenv("SYNTHWATCH_KEY_UNSET", raising=False)
    srv = live_app(launch_dataset_dirs=str(data))
    with KeyEchoServer() as echo, httpx.Client(base_url=srv.url, timeout=60) as c:
        for name, why in (("SYNTHWATCH_KEY_SHORT", "fewer than 8 characters"), ("SYNTHWATCH_KEY_NL", "a line break"),
                          ("SYNTHWATCH_KEY_UNSET", "is not set")):
            r = c.post("/runs/new", data={**_form(echo.url, api_key_env=name), "dataset": str(data / "p.jsonl"),
                                          "name": f"f-{name}"}, follow_redirects=False)
            assert r.status_code == 400 and name in r.text and why in r.text, (name, r.text[-3000:])
            a = c.post("/api/runs", json={"dataset": str(data / "p.jsonl"), "endpoints": [echo.url], "model": "m",
                                          "api_key_env": name, "name": f"a-{name}"})
            assert a.status_code == 400 and name in a.json()["detail"] and why in a.json()["detail"], a.text
            assert "sk-0123456789" not in r.text + a.text
        assert c.get("/api/runs").json()["runs"] == [] and echo.seen == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["at_cut", "mojibake"])
def test_a_worker_stores_no_piece_of_an_echoed_key(tmp_path: Path, mode: str) -> None:
    """The key echoed across the 2,000-character cut, or as mojibake: nothing of it in the database, the worker's
    output or the records' errors."""
    db = tmp_path / "echo.db"
    with KeyEchoServer(mode) as echo:
        proc = run_cli("run", "--dataset", str(write_prompts(tmp_path / "p.jsonl", 3)), "--base-url", echo.url,
                       "--model", "m", "--db", str(db), "--api-key-env", "SW_ECHO_KEY", "--retries-max-attempts", "1",
                       # the echo server answers /v1/models with the key too: the preflight's own refusal is
                       # test_probe_cli_never_prints_an_echoed_key's; here the worker's requests are the subject
                       "--no-preflight", "--name", "echo", env=cli_env(SW_ECHO_KEY=KEY), timeout=120)
    assert echo.seen and set(echo.seen) == {KEY}
    out = proc.stdout + proc.stderr
    assert leaks(KEY, out) == [], out
    import sqlite3

    with sqlite3.connect(db) as conn:
        errors = [r[0] for r in conn.execute("SELECT error FROM record")]
        events = [r[0] for r in conn.execute("SELECT message FROM error_event")]
    assert errors and all(e and "[redacted]" in e for e in errors), errors
    for text in errors + events:
        assert leaks(KEY, text or "") == [], text
    for suffix in ("", "-wal"):
        f = Path(str(db) + suffix)
        if f.exists():
            raw = f.read_bytes().decode("utf-8", "replace")
            assert leaks(KEY, raw) == [], f"a piece of the key is in {f.name}"
