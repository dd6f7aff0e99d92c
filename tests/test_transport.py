"""The worker's transport settings and its guarantees: keys and header values checked at start-up, secrets
redacted from logs, TLS per endpoint, proxies from the environment, extra headers, and no exception at any
stage of a record's processing leaving the record in flight.

Everything runs against real local servers: the simulator, :class:`HostileServer`, a TLS server with a
certificate authority made by openssl for the test, and a recording HTTP proxy.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import cli_env, require, run_async, run_cli
from sqlalchemy import text

from synthwatch.config import ConfigError, EndpointConfig, EndpointPoolConfig, build_config
from synthwatch.redact import REDACTED, add_secret, redact
from synthwatch.workers import faults
from synthwatch.workers.client import Requester
from synthwatch.workers.endpoints import EndpointPool, MissingApiKey
from tests.hostileserver import GOOD_JSON, HostileServer, head, stop_thread_loop
from tests.workerkit import Background, make_config, records

BODY = b'{"model": "sim-reasoner", "stream": false, "messages": [{"role": "user", "content": "What is 1 + 2?"}]}'


def pool(monkeypatch: Any, env: dict[str, str] | None = None, **endpoint: Any) -> EndpointPool:
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return EndpointPool([EndpointConfig.model_validate(endpoint)], EndpointPoolConfig())


async def one(ep: Any, stream: bool = False, **requester: Any) -> Any:
    async with Requester(connect_timeout_s=5, total_timeout_s=20, idle_timeout_s=10, **requester) as r:
        return await r.attempt(ep, BODY.replace(b"false", b"true") if stream else BODY, stream)


# ---------------------------------------------------------------- keys and header values


def test_zero_width_space_in_the_key_is_refused_at_start_up_without_showing_the_key(tmp_path: Path,
                                                                                      prompts: Any) -> None:
    """The reproduction: a key pasted with a zero-width space used to strand every claimed record in flight and
    log the key once per record. Now the run does not start, and the message names the variable only."""
    key = "sk-live-\u200b4f1c2d3e5a6b7c8d9e0f"
    proc = run_cli("run", "--dataset", str(prompts(3)), "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
                   "--db", str(tmp_path / "k.db"), "--api-key-env", "SW_ZWSP_KEY", "--quiet",
                   env=cli_env(SW_ZWSP_KEY=key))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "SW_ZWSP_KEY" in proc.stderr and "U+200B (ZERO WIDTH SPACE)" in proc.stderr, proc.stderr
    for part in (key, "4f1c2d3e5a6b7c8d9e0f", "sk-live-"):
        assert part not in out


@pytest.mark.parametrize(("value", "why"), [
    ("sk-abc\r\nX-Evil: 1", "a line break"),
    ("sk-abc\u200bdef", "U+200B (ZERO WIDTH SPACE)"),
    ("sk-abc\u2028def", "U+2028 (LINE SEPARATOR)"),
    ("sk-abc\x7fdef", "U+007F"),
    ("sk-abc\u4e2ddef", "a character beyond Latin-1"),
])
def test_a_value_an_http_header_cannot_carry_is_refused_naming_the_variable(monkeypatch: Any, value: str,
                                                                            why: str) -> None:
    for kind, cfg in (("key", {"api_key_env": "SW_T_VALUE"}), ("header", {"headers_env": {"X-Org": "SW_T_VALUE"}})):
        with pytest.raises(MissingApiKey) as info:
            pool(monkeypatch, {"SW_T_VALUE": value}, base_url="http://127.0.0.1:9/v1", **cfg)
        msg = str(info.value)
        assert "SW_T_VALUE" in msg and why in msg, (kind, msg)
        assert "sk-abc" not in msg and "def" not in msg.split("SW_T_VALUE")[1].split("(")[0]


def test_latin1_keys_and_header_values_are_accepted_and_sent(monkeypatch: Any) -> None:
    with HostileServer(lambda r, w: asyncio.sleep(0)) as srv:
        p = pool(monkeypatch, {"SW_T_KEY": "sk-clé-1", "SW_T_ORG": "org-ä-0001"}, base_url=srv.url,
                 api_key_env="SW_T_KEY", headers_env={"OpenAI-Organization": "SW_T_ORG"})
        res = run_async(one(p.endpoints[0]))
        assert res.ok, res.message
    sent = srv.heads[0]
    # aiohttp writes header values as UTF-8
    assert "Authorization: Bearer sk-clé-1".encode() in sent and "OpenAI-Organization: org-ä-0001".encode() in sent


def test_missing_header_variable_and_bad_header_config_are_refused(monkeypatch: Any) -> None:
    monkeypatch.delenv("SW_T_UNSET", raising=False)
    with pytest.raises(MissingApiKey, match="SW_T_UNSET is not set"):
        pool(monkeypatch, base_url="http://127.0.0.1:9/v1", headers_env={"X-Org": "SW_T_UNSET"})
    base = {"dataset": {"path": "x.jsonl"}, "model": "m"}
    for headers, words in (({"X Bad": "E"}, "not a valid HTTP header name"),
                           ({"Host": "E"}, "set by the HTTP client"),
                           ({"X-Org": "the-value-itself"}, "NAME of an environment variable")):
        with pytest.raises(ConfigError, match=words):
            build_config({**base, "endpoints": [{"base_url": "http://h/v1", "headers_env": headers}]}, "test")
    with pytest.raises(ConfigError, match="not both"):
        build_config({**base, "endpoints": [{"base_url": "http://h/v1", "api_key_env": "K",
                                             "headers_env": {"authorization": "E"}}]}, "test")


# ---------------------------------------------------------------- redaction


def test_logs_never_show_a_registered_secret_or_a_bearer_token() -> None:
    secret = "sk-redact-\u00e9-0123456789"
    add_secret(secret)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("synthwatch.test_redaction")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.warning("key %s in an argument", secret)
        log.warning("headers %r", {"Authorization": f"Bearer {secret}"})
        log.warning("bytes %r", f"Bearer {secret}".encode())
        log.warning("someone else's Authorization: Bearer tok_ABCdef123456")
        try:
            raise ValueError(f"request failed with {secret}")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    out = buf.getvalue()
    assert "0123456789" not in out and "tok_ABCdef123456" not in out, out
    assert out.count(REDACTED) >= 5 and "ValueError: request failed with" in out
    assert redact(f"x {secret} y") == f"x {REDACTED} y"


# ---------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: Any) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    require(shutil.which("openssl") is not None, "openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture
def tls_server(pki: dict[str, Path]) -> Iterator[str]:
    """An https server that asks for a client certificate from the test CA and answers a valid reply."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca.pem"]))
    ctx.load_cert_chain(pki["server.pem"], pki["server.key"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head_ = await r.readuntil(b"\r\n\r\n")
            n = next(int(x.split(b":")[1]) for x in head_.split(b"\r\n") if x.lower().startswith(b"content-length"))
            await r.readexactly(n)
            w.write(head(ctype="application/json", length=len(GOOD_JSON)) + GOOD_JSON)
            await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            w.close()

    async def start() -> None:
        box["server"] = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        box["url"] = f"https://127.0.0.1:{box['server'].sockets[0].getsockname()[1]}/v1"
        started.set()

    t = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    t.start()
    started.wait(10)
    yield box["url"]
    loop.call_soon_threadsafe(box["server"].close)
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def test_tls_ca_bundle_client_certificate_and_verify(monkeypatch: Any, tls_server: str,
                                                     pki: dict[str, Path]) -> None:
    client = {"client_cert": str(pki["client.pem"]), "client_key": str(pki["client.key"])}
    cases = [
        ({}, "connect", "CERTIFICATE_VERIFY_FAILED"),  # the system's CAs do not know the test CA
        ({"ca_bundle": str(pki["ca.pem"])}, "dropped|connect", ""),  # trusted, but no client certificate
        ({"ca_bundle": str(pki["ca.pem"]), **client}, "ok", ""),
        ({"verify": False, **client}, "ok", ""),  # testing only: any server certificate
    ]
    for tls, expect, words in cases:
        ep = pool(monkeypatch, base_url=tls_server, tls=tls).endpoints[0]
        res = run_async(one(ep))
        got = "ok" if res.ok else res.kind
        assert got in expect.split("|"), (tls, res.kind, res.message)
        assert words in res.message
    with pytest.raises(MissingApiKey, match="TLS settings"):
        pool(monkeypatch, base_url=tls_server, tls={"ca_bundle": str(pki["ca.pem"]) + ".missing"})


# ---------------------------------------------------------------- proxies


class RecordingProxy:
    """A plain HTTP forward proxy (absolute-form requests) that keeps each request head it relays."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.transport.abort()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        head_ = await cr.readuntil(b"\r\n\r\n")
        self.heads.append(head_)
        target = head_.split(b" ")[1].decode()  # http://host:port/path
        hostport, path = target.split("://", 1)[1].split("/", 1)
        host, port = hostport.rsplit(":", 1)
        sr, sw = await asyncio.open_connection(host, int(port))
        first, rest = head_.split(b"\r\n", 1)
        sw.write(first.replace(target.encode(), b"/" + path.encode()) + b"\r\n" + rest)
        await asyncio.gather(self._pipe(cr, sw), self._pipe(sr, cw))

    def __enter__(self) -> RecordingProxy:
        self.thread.start()

        async def start() -> None:
            self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        stop_thread_loop(self.loop, self.thread, self.server)


def test_proxy_from_the_environment_with_credentials_and_no_proxy(monkeypatch: Any, sim: Any) -> None:
    base = sim()
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with RecordingProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://user:pr0xy-s3cret@127.0.0.1:{proxy.port}")
        ep = pool(monkeypatch, base_url=base).endpoints[0]
        assert ep.proxy == f"http://127.0.0.1:{proxy.port}"
        res = run_async(one(ep, stream=True))
        assert res.ok, res.message
        assert len(proxy.heads) == 1 and proxy.heads[0].startswith(f"POST {base}/chat/completions ".encode())
        assert b"Proxy-Authorization: Basic dXNlcjpwcjB4eS1zM2NyZXQ=" in proxy.heads[0]
        assert "pr0xy-s3cret" not in redact("proxy http://user:pr0xy-s3cret@x")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        ep = pool(monkeypatch, base_url=base).endpoints[0]
        assert ep.proxy is None
        assert run_async(one(ep)).ok and len(proxy.heads) == 1


# ---------------------------------------------------------------- nothing escapes a record


def _dataset(tmp_path: Path, n: int = 6) -> Path:
    from conftest import write_prompts

    return write_prompts(tmp_path / "p.jsonl", n)


def _ends(engine: Any, bg: Background) -> list[dict[str, Any]]:
    final = bg.join(60)
    recs = records(engine, bg.run_id)
    # a run in which every request failed ends "failed", never "completed" (#26)
    assert final == ("completed" if any(r["status"] == "ok" for r in recs) else "failed"), final
    assert all(r["status"] in ("ok", "error") for r in recs), [r["status"] for r in recs]  # none in flight
    return recs


@pytest.mark.parametrize("stage", faults.STAGES)
def test_an_exception_at_any_stage_is_recorded_on_the_record(stage: str, engine: Any, sim: Any, tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    secret = "sk-stage-secret-000111222"
    monkeypatch.setenv("SW_STAGE_KEY", secret)
    config = make_config(sim(), _dataset(tmp_path), endpoints=[{"base_url": sim(), "api_key_env": "SW_STAGE_KEY"}])
    faults.armed[stage] = RuntimeError(f"injected at {stage}; headers: Authorization: Bearer {secret}")
    try:
        bg = Background(engine, config).start()
        recs = _ends(engine, bg)
    finally:
        faults.armed.clear()
    for r in recs:
        assert r["status"] == "error" and r["error_kind"] == "internal_error", (r["status"], r["error"])
        assert r["error"].startswith(f"RuntimeError during {stage}: injected at {stage}")
        assert secret not in r["error"] and secret not in (r["attempts_json"] or "")
    assert bg.worker.pool.endpoints[0].outstanding == 0


def test_real_faults_at_claim_build_and_send_are_recorded(engine: Any, sim: Any, tmp_path: Path) -> None:
    """Without fault points: a claimed row whose attempts do not decode (claim), a body orjson cannot write
    (request build: an integer beyond 64 bits in the request body), and a header that would inject a line (send)."""
    # claim: the stored attempts of two records are not JSON
    config = make_config(sim(), _dataset(tmp_path), name="claim")
    bg = Background(engine, config)
    with engine.begin() as conn:
        conn.execute(text("UPDATE record SET attempts_json = '{not json' WHERE run_id = :r AND idx < 2"),
                     {"r": bg.run_id})
    recs = _ends(engine, bg.start())
    assert [r["error_kind"] for r in recs[:2]] == ["internal_error"] * 2 and "during claim" in recs[0]["error"]
    assert all(r["status"] == "ok" for r in recs[2:])

    # request build: the body the worker built at start-up gets a value JSON cannot carry
    config = make_config(sim(), _dataset(tmp_path), name="build")
    bg = Background(engine, config)
    bg.worker._body_base["n_big"] = 2**70
    recs = _ends(engine, bg.start())
    assert all(r["error_kind"] == "internal_error" and "during request build" in r["error"] for r in recs)

    # send: a header value with a line break (start-up refuses one from the environment; here it is put in
    # afterwards) is refused by aiohttp as header injection
    config = make_config(sim(), _dataset(tmp_path), name="send")
    bg = Background(engine, config)
    bg.worker.pool.endpoints[0].headers["X-Broken"] = "a\r\nX-Evil: 1"
    recs = _ends(engine, bg.start())
    assert all(r["error_kind"] == "internal_error" and "ValueError" in r["error"] for r in recs), \
        [(r["error_kind"], r["error"]) for r in recs]


def test_a_check_that_raises_flags_the_record_and_the_run_goes_on(engine: Any, sim: Any, tmp_path: Path) -> None:
    from synthwatch.quality.live import writer_hooks

    config = make_config(sim(), _dataset(tmp_path), name="checks")
    made: list[Any] = []

    def hooks(run_id: int) -> list[Any]:
        made.extend(writer_hooks(engine, run_id, config))
        return made

    bg = Background(engine, config, hooks=hooks)

    def broken(view: Any) -> Any:
        raise KeyError("a check bug")

    made[0].checker.check = broken
    recs = _ends(engine, bg.start())
    assert all(r["status"] == "ok" for r in recs)
    assert all("check_error" in orjson.loads(r["check_json"]) for r in recs)
