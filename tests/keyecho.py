"""A server that echoes the API key it was sent back in its error replies, in the forms real servers use.

Every request is answered 401 with the Authorization header's key in the body, written as ``mode`` says:
raw, JSON-escaped (``\\u00e9``, ``\\/``), percent-encoded (``+`` for a space), Latin-1 mojibake of its UTF-8
bytes, HTML-escaped, cut short (the key's first characters only), straddling a 2,000-character cut, or buried
in 50 kB of text. ``seen`` keeps every key received (the header decoded as UTF-8, as the clients send it).
"""

from __future__ import annotations

import html
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("raw", "json", "url", "mojibake", "html", "cut_short", "at_cut", "long")
FILLER = "lorem ipsum dolor sit amet "


def echo(key: str, mode: str, pad: int = 0) -> str:
    """The key as a server in ``mode`` writes it (``pad``: filler characters before it)."""
    if mode == "json":
        form = json.dumps(key)[1:-1].replace("/", "\\/")
    elif mode == "url":
        form = urllib.parse.quote_plus(key)
    elif mode == "mojibake":
        form = key.encode("utf-8").decode("latin-1")
    elif mode == "html":
        form = html.escape(key)
    elif mode == "cut_short":
        form = key[: max(8, len(key) * 2 // 3)] + "..."
    elif mode == "at_cut":  # the key straddles character 2,000 of the message the worker keeps
        pad = max(0, 1990 - len("Incorrect API key provided: "))
        form = key
    elif mode == "long":
        pad = 50_000
        form = key
    else:
        form = key
    filler = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return f"{filler}Incorrect API key provided: {form}. You can find your API key at https://example.invalid/keys"


class KeyEchoServer:
    def __init__(self, mode: str = "raw", as_json: bool = True) -> None:
        self.mode = mode
        self.as_json = as_json
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                auth = self.headers.get("authorization") or ""
                key = auth.encode("latin-1").decode("utf-8", "replace").removeprefix("Bearer ")
                outer.seen.append(key)
                message = echo(key, outer.mode)
                if outer.as_json:
                    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}},
                                      ensure_ascii=outer.mode == "json").encode()
                    ctype = "application/json"
                else:
                    body, ctype = message.encode(), "text/plain; charset=utf-8"
                self.send_response(401)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> KeyEchoServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def leaks(key: str, text: str, n: int = 8) -> list[str]:
    """Pieces of ``key`` of ``n`` characters found in ``text``, as is or in any echoed form."""
    found = []
    grams = {key[i:i + n] for i in range(len(key) - n + 1)} or {key}
    for g in grams:
        forms = {g, json.dumps(g)[1:-1], json.dumps(g)[1:-1].replace("/", "\\/"),
                 json.dumps(g, ensure_ascii=False)[1:-1], urllib.parse.quote_plus(g),
                 urllib.parse.quote(g), html.escape(g)}
        try:
            forms.add(g.encode("utf-8").decode("latin-1"))
        except UnicodeEncodeError:
            pass
        found += [f for f in forms if f in text]
    return found
