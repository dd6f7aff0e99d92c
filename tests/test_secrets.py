"""An API key given through --api-key-env reaches the endpoint and nothing else.

A run through the CLI with a unique fake key, against the simulator behind a recording TCP relay (which proves
the key was sent). Then the key is searched for in: the SQLite file, its -wal and -shm; the worker's stdout and
stderr; every page, fragment and API response of the run; and each export format's file and manifest.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import cli_env, run_cli


class RecordingRelay:
    """A TCP relay to the simulator that keeps every byte the client sends (the request headers)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sent = bytearray()
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, keep: bool) -> None:
        try:
            while data := await r.read(65536):
                if keep:
                    self.sent += data
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        await asyncio.gather(self._pipe(cr, sw, True), self._pipe(sr, cw, False))

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def __enter__(self) -> RecordingRelay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(params=["ascii", "non_ascii", "contains_base_url"])
def keyed_run(request: Any, tmp_path: Path, sim: Any, prompts: Any) -> Iterator[dict[str, Any]]:
    """A run with a unique key: plain ASCII; with Latin-1 letters (sent UTF-8-encoded, as aiohttp writes every
    header); and one that contains the endpoint's own base URL (which legitimately appears everywhere)."""
    rand = uuid.uuid4().hex
    sim_url = sim(rate_500=0.1, rate_error_body=0.05, seed=3)
    sim_port = int(sim_url.split(":")[2].split("/")[0])
    db = tmp_path / "keyed.db"
    with RecordingRelay(sim_port) as relay:
        base = f"http://127.0.0.1:{relay.port}/v1"
        key = {"ascii": f"sk-test-{rand}", "non_ascii": f"sk-tést-clé-{rand}",
               "contains_base_url": f"sk-test-{rand}-{base}"}[request.param]
        proc = run_cli("run", "--dataset", str(prompts(40)), "--base-url", base,
                       "--model", "sim-reasoner", "--db", str(db), "--name", "keyed", "--api-key-env", "SW_KEY",
                       env=cli_env(SW_KEY=key), timeout=120)
    assert proc.returncode == 0, proc.stderr
    yield {"key": key, "rand": rand, "db": db, "proc": proc, "sent": bytes(relay.sent), "tmp": tmp_path}


@pytest.mark.slow
def test_api_key_is_used_and_never_stored_or_shown(keyed_run: dict[str, Any], live_app: Any, db_path: Path) -> None:
    key, db = keyed_run["key"], keyed_run["db"]
    # the whole key in each encoding and escape it could be written in, and its random part alone
    needles = {key.encode(), key.encode("latin-1"), json.dumps(key)[1:-1].encode(), keyed_run["rand"].encode()}

    def clean(where: str, data: bytes) -> None:
        for n in needles:
            assert n not in data, f"the API key leaked into {where}"

    # the endpoint did get it, as a bearer token
    assert f"Bearer {key}".encode() in keyed_run["sent"]  # UTF-8, as aiohttp writes header values
    assert keyed_run["sent"].count(b"POST /v1/chat/completions") >= 40

    proc = keyed_run["proc"]
    clean("worker stdout", proc.stdout.encode())
    clean("worker stderr", proc.stderr.encode())

    # exports (each format) with their manifests
    for fmt in ("messages", "sharegpt", "tokens", "raw"):
        out = keyed_run["tmp"] / f"out-{fmt}.jsonl"
        extra = ["--tokenizer", "deepseek-v4", "--chat-template", "deepseek-v4"] if fmt == "tokens" else []
        p = run_cli("export", "keyed", "--db", str(db), "--format", fmt, "--out", str(out), "--quiet", *extra)
        assert p.returncode == 0, (fmt, p.stderr)
        clean(f"export {fmt} output", out.read_bytes())
        manifest = Path(str(out) + ".manifest.json") if Path(str(out) + ".manifest.json").exists() \
            else out.with_suffix(".manifest.json")
        assert manifest.exists(), fmt
        clean(f"export {fmt} manifest", manifest.read_bytes())
        assert b"SW_KEY" in manifest.read_bytes()  # the config names the variable, not its value
        clean(f"export {fmt} stdout/stderr", (p.stdout + p.stderr).encode())

    # every page, fragment and API response of the run (the dashboard serves the same file)
    import shutil

    for suffix in ("", "-wal", "-shm"):
        if Path(str(db) + suffix).exists():
            shutil.copy(str(db) + suffix, str(db_path) + suffix)
    app = live_app()
    status, body = _get(f"{app.url}/api/runs")
    assert status == 200
    run_id = orjson.loads(body)[0]["id"] if isinstance(orjson.loads(body), list) else orjson.loads(body)["runs"][0]["id"]
    status, body = _get(f"{app.url}/api/runs/{run_id}/records?limit=100")
    assert status == 200
    data = orjson.loads(body)
    rows = data["records"] if isinstance(data, dict) else data
    rec_ids = [r["id"] for r in rows][:5]
    errored = [r["id"] for r in rows if r.get("status") != "ok"][:3]
    paths = [
        "/runs", "/runs/table", "/runs/new", f"/runs/{run_id}", f"/runs/{run_id}/stats", f"/runs/{run_id}/charts",
        f"/runs/{run_id}/audit", f"/runs/{run_id}/records", f"/runs/{run_id}/records/count",
        f"/runs/{run_id}/sample", f"/runs/{run_id}/checks", f"/runs/{run_id}/checks/table",
        f"/runs/{run_id}/alarms/banner", f"/runs/{run_id}/export", f"/runs/{run_id}/exports/list",
        "/api/runs", f"/api/runs/{run_id}", f"/api/runs/{run_id}/stats", f"/api/runs/{run_id}/timeseries",
        f"/api/runs/{run_id}/errors", f"/api/runs/{run_id}/events", f"/api/runs/{run_id}/records?limit=100",
        f"/api/runs/{run_id}/records/count", f"/api/runs/{run_id}/sample", f"/api/runs/{run_id}/alarms",
        f"/api/runs/{run_id}/checks", f"/api/runs/{run_id}/exports", "/openapi.json", "/docs",
    ]
    for rid in rec_ids + errored:
        paths += [f"/runs/{run_id}/records/{rid}", f"/api/runs/{run_id}/records/{rid}",
                  f"/runs/{run_id}/records/{rid}/tokens"]
    status, body = _get(f"{app.url}/api/runs/{run_id}/errors")
    assert status == 200 and b"500" in body  # the injected faults left error events (with bodies) to look at
    for path in paths:
        status, body = _get(app.url + path)
        assert status < 500, (path, status)
        clean(f"GET {path}", body)
    status, body = _get(f"{app.url}/api/runs/{run_id}")
    assert b"SW_KEY" in body  # the stored config keeps the variable's name only

    # last, the raw database files (after the dashboard ran too)
    for suffix in ("", "-wal", "-shm"):
        for f in (Path(str(db) + suffix), Path(str(db_path) + suffix)):
            if f.exists():
                clean(f"database file {f.name}", f.read_bytes())
