"""The worker's HTTP/1.1 client against a real socket server that sends scripted bytes.

Each test runs a server and the client on one event loop; the server reads each request (head and
Content-Length body) and answers with the bytes a test scripts, which covers framings and faults
the simulator never produces (bytes split anywhere, 1xx replies, trailers, gzip, stale keep-alive).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from synthwatch.workers.http1 import HttpClient, HttpFailure

Reply = Callable[[asyncio.StreamWriter, bytes], Awaitable[bool]]  # returns False to close the connection


class ScriptServer:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None
        self.url = ""

    async def __aenter__(self) -> ScriptServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = await r.readexactly(length)
                self.requests.append(head + body)
                if not await self.reply(w, body):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


def run(coro: Awaitable[Any]) -> Any:
    """Run on a fresh event loop in a thread of its own: the browser tests' Playwright keeps a loop
    running in the main thread for the whole session."""
    async def main() -> Any:
        return await coro
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


async def fetch(client: HttpClient, url: str, body: bytes = b'{"q": 1}', idle_s: float | None = None,
                stream: bool = False) -> tuple[int, dict[str, str], bytes]:
    ex = await client.post(url, body, {"Content-Type": "application/json"}, idle_s=idle_s)
    try:
        if stream:
            pieces: list[bytes] = []
            await ex.stream(lambda b: pieces.append(b) is None)
            data = b"".join(pieces)
        else:
            data = await ex.read()
        return ex.status, ex.headers, data
    finally:
        ex.release()


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def dribble(w: asyncio.StreamWriter, data: bytes) -> None:
    """One byte per write, each sent on its own: every framing boundary gets split."""
    for i in range(len(data)):
        w.write(data[i:i + 1])
        await w.drain()
        await asyncio.sleep(0)


def test_chunked_reply_split_at_every_byte_with_interim_reply_extensions_and_trailers() -> None:
    payload = b"data: {\"a\": 1}\n\n" * 3

    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        await dribble(w, b"HTTP/1.1 100 Continue\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + b"%x;ext=1\r\n%s\r\n" % (len(payload[:20]), payload[:20])
                      + chunked(payload[20:]).replace(b"0\r\n\r\n", b"0\r\nX-Trailer: yes\r\n\r\n"))
        return True

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            status, headers, data = await fetch(client, srv.url, idle_s=5, stream=True)
            assert (status, headers["content-type"], data) == (200, "text/event-stream", payload)
            # the connection came back clean: the next request reuses it
            status, _, data = await fetch(client, srv.url, idle_s=5, stream=True)
            assert (status, data, srv.connections) == (200, payload, 1)
            await client.close()

    run(go())


def test_keep_alive_reuse_connection_close_and_request_bytes() -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        close = body == b"close"
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                % (len(body), b"Connection: close\r\n" if close else b"", body))
        return not close

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            for i in range(5):
                assert (await fetch(client, srv.url, b"x" * i))[2] == b"x" * i
            assert srv.connections == 1
            assert (await fetch(client, srv.url, b"close"))[2] == b"close"
            assert (await fetch(client, srv.url, b"again"))[2] == b"again"
            assert srv.connections == 2
            head = srv.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
            assert head[0] == b"POST /v1/chat/completions HTTP/1.1"
            assert b"Host: 127.0.0.1:" + srv.url.split(":")[2].split("/")[0].encode() in head
            assert b"Content-Length: 0" in head and b"Content-Type: application/json" in head
            await client.close()

    run(go())


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_a_failure() -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        return False  # closes after each reply without saying so (a keep-alive timeout on the server)

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            assert (await fetch(client, srv.url))[2] == b"ok"
            await asyncio.sleep(0.1)  # the server's close reaches the idle connection
            assert (await fetch(client, srv.url))[2] == b"ok"
            assert srv.connections == 2
            await client.close()

    run(go())


def test_close_delimited_body_and_gzip_body() -> None:
    text = b'{"choices": []}' * 100

    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        if body == b"gzip":
            z = gzip.compress(text)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(z), z))
            return True
        await dribble(w, b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + text[:50])
        w.write(text[50:])
        return False

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            assert (await fetch(client, srv.url, b"gzip"))[2] == text
            assert (await fetch(client, srv.url, b"plain"))[2] == text
            assert (await fetch(client, srv.url, b"gzip", stream=True))[2] == text
            await client.close()

    run(go())


@pytest.mark.parametrize(("raw", "kind", "words"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", "dropped", "while sending the reply body"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", "dropped", "reply body"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "dropped", "before a complete reply head"),
    (b"", "dropped", "before a complete reply head"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "http_error", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "http_error", "CRLF"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "http_error", "not an HTTP/1.x reply"),
    (b"HTTP/1.1 abc\r\n\r\n", "http_error", "not an HTTP/1.x reply"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n", "http_error", "content-length"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx", "http_error", "not supported"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nnope", "http_error", "decompress"),
])
def test_broken_replies_fail_with_a_kind_and_a_reason(raw: bytes, kind: str, words: str) -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(raw)
        await w.drain()
        return False

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            with pytest.raises(HttpFailure) as info:
                await fetch(client, srv.url)
            assert info.value.kind == kind and words in info.value.message, info.value.message
            # the client stays usable
            with pytest.raises(HttpFailure):
                await fetch(client, srv.url, stream=True)
            await client.close()

    run(go())


def test_idle_timeout_fires_on_a_stall_not_on_a_slow_steady_stream() -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        gaps = [0.25] * 8 if body == b"steady" else [0.1, 3.0]
        for gap in gaps:
            await asyncio.sleep(gap)
            w.write(chunked(b"tick")[:-5])
            await w.drain()
        w.write(b"0\r\n\r\n")
        return True

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            t = time.monotonic()
            _, _, data = await fetch(client, srv.url, b"steady", idle_s=0.6, stream=True)
            assert data == b"tick" * 8 and time.monotonic() - t >= 2.0  # 2 s in all, never 0.6 s silent
            t = time.monotonic()
            with pytest.raises(HttpFailure) as info:
                await fetch(client, srv.url, b"stall", idle_s=0.6, stream=True)
            assert info.value.kind == "idle_timeout"
            assert 0.6 <= time.monotonic() - t < 2.0
            await client.close()

    run(go())


def test_read_limit_and_a_sink_that_stops_end_the_reply_and_the_connection() -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"e" * 5000)
        await w.drain()
        await asyncio.sleep(0.2)  # the client has stopped reading by now
        w.write(b"e" * 95_000)
        return True

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            ex = await client.post(srv.url, b"{}", {}, idle_s=None)
            assert len(await ex.read(1000)) == 1000
            ex.release()
            ex = await client.post(srv.url, b"{}", {}, idle_s=None)
            got: list[bytes] = []
            await ex.stream(lambda b: got.append(b) is not None)  # stops after the first piece
            ex.release()
            assert len(got) == 1 and srv.connections == 2  # a half-read reply is never reused
            assert len((await fetch(client, srv.url))[2]) == 100_000
            assert srv.connections == 3
            await client.close()

    run(go())


def test_connect_failures_and_header_injection() -> None:
    async def go() -> None:
        client = HttpClient(connect_timeout_s=2)
        with pytest.raises(HttpFailure) as info:
            await client.post("http://127.0.0.1:9/v1/chat/completions", b"{}", {}, idle_s=None)
        assert info.value.kind == "connect" and "127.0.0.1:9" in info.value.message
        with pytest.raises(ValueError, match="line break"):
            await client.post("http://127.0.0.1:9/x", b"{}", {"Authorization": "Bearer k\r\nX-Evil: 1"}, idle_s=None)
        with pytest.raises(ValueError, match="not an http"):
            await client.post("ftp://127.0.0.1/x", b"{}", {}, idle_s=None)
        await client.close()

    run(go())


def test_an_api_key_with_a_line_break_is_refused_at_start_without_showing_it(monkeypatch: Any) -> None:
    from synthwatch.config import EndpointConfig, EndpointPoolConfig
    from synthwatch.workers.endpoints import EndpointPool, MissingApiKey

    monkeypatch.setenv("SW_TEST_KEY", "sk-secret\r\nX-Evil: 1")
    with pytest.raises(MissingApiKey) as info:
        EndpointPool([EndpointConfig(base_url="http://127.0.0.1:9/v1", api_key_env="SW_TEST_KEY")],
                     EndpointPoolConfig())
    assert "SW_TEST_KEY" in str(info.value) and "sk-secret" not in str(info.value)


def test_https_verifies_the_server_certificate(tmp_path: Any, monkeypatch: Any) -> None:
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async def go() -> None:
        async with ScriptServer(reply) as plain:
            port = int(plain.url.split(":")[2].split("/")[0])
        srv = await asyncio.start_server(ScriptServer(reply)._handle, "127.0.0.1", port, ssl=server_ctx)
        url = f"https://127.0.0.1:{port}/v1/chat/completions"
        try:
            client = HttpClient(connect_timeout_s=5)  # the system's CAs: this certificate is not among them
            with pytest.raises(HttpFailure) as info:
                await fetch(client, url)
            assert info.value.kind == "connect" and "CERTIFICATE_VERIFY_FAILED" in info.value.message
            await client.close()
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # OpenSSL's standard way to trust a private CA
            client = HttpClient(connect_timeout_s=5)
            assert (await fetch(client, url, b"secure"))[2] == b"secure"
            assert (await fetch(client, url, b"again"))[2] == b"again"
            await client.close()
        finally:
            srv.close()

    run(go())


def test_a_sink_that_stops_gets_no_further_piece_of_the_same_read() -> None:
    async def reply(w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await w.drain()
        await asyncio.sleep(0.2)  # the client is streaming by now
        w.write(chunked(b"one", b"two", b"three"))  # three chunks, one read
        return True

    async def go() -> None:
        async with ScriptServer(reply) as srv:
            client = HttpClient(connect_timeout_s=5)
            ex = await client.post(srv.url, b"{}", {}, idle_s=5)
            got: list[bytes] = []
            await ex.stream(lambda b: got.append(b) is not None)  # stops at the first piece
            ex.release()
            assert got == [b"one"]
            await client.close()

    run(go())
