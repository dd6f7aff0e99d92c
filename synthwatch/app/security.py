"""Security middleware: CSP and friends, cross-site request refusal, optional token auth.

A dashboard that can stop a multi-hour run is reachable from any page the user visits (a page
on another site can POST to localhost), so every state-changing request must come from our own
origin, and the Host header must be ours (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TOKEN_COOKIE = "synthwatch_token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_only(hostport: str) -> str:
    if hostport.startswith("["):
        return hostport.split("]")[0] + "]"
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


def cross_site_reason(request: Request) -> str | None:
    """Why a state-changing request must be refused, or None when it comes from our own pages."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = request.headers.get("origin")
    if origin is not None:
        if origin == "null":
            return "cross-site request refused (Origin: null)"
        o = urlsplit(origin)
        host = request.headers.get("host", "")
        if o.netloc.lower() != host.lower():
            return f"cross-site request refused (Origin {origin} is not this dashboard)"
    return None


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or "application/json" in request.headers.get("accept", "")


def too_large(limit: int) -> str:
    """What a 413 says: the dashboard's body limit (FastAPI's max_body_size, set from the settings) and its name."""
    return (f"request body too large: the dashboard accepts at most {limit:,} bytes (the max_request_body_bytes "
            "setting, SYNTHWATCH_MAX_REQUEST_BODY_BYTES); nothing was done")


class BodyLimit:
    """A request body over ``limit`` bytes is refused with 413, never read whole (ASGI middleware, outside the
    others). A Content-Length over the limit is answered at once, none of the body read. A body without one
    (chunked) is counted as it arrives: past the limit the app is told the client went away (so nothing waits
    for, or holds, the rest) and whatever it answers is replaced by the 413. At most the limit plus one chunk of
    the server's reads (64 KiB) is ever held."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def _refuse(self, scope: Any, receive: Any, send: Any) -> None:
        detail = too_large(self.limit)
        if str(scope.get("path", "")).startswith("/api/"):
            response: Response = JSONResponse({"detail": detail}, status_code=413)
        else:
            response = PlainTextResponse(detail, status_code=413)
        response.headers["Connection"] = "close"  # the rest of the body is never read: this connection is done
        await response(scope, receive, send)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)
        if length is not None and length.strip().isdigit() and int(length) > self.limit:
            await self._refuse(scope, receive, send)
            return
        received = 0
        exceeded = started = False

        async def counted() -> Any:
            nonlocal received, exceeded
            if exceeded:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > self.limit:
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Any) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's answer to a body it never got whole: replaced by the 413 below
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not exceeded or started:
                raise  # not ours: the usual 500 handling
        if exceeded and not started:
            await self._refuse(scope, receive, send)


ID_MAX = 2**63 - 1  # the database's integer keys are signed 64-bit


async def ids_in_range(request: Request) -> None:
    """Every route's dependency: a path id (``run_id``, ``record_id``, ...) that no row can have, negative or
    beyond a 64-bit key, is a 404 naming it; without this, 2^63 reached the database driver as an OverflowError
    (a 500)."""
    for name, value in request.path_params.items():
        if not (name == "id" or name.endswith("_id")):
            continue
        raw = str(value)
        digits = raw[1:] if raw[:1] in "+-" else raw
        if not digits.isdigit() or not digits.isascii():
            continue  # not a number at all: the route's own validation says so (400)
        if len(digits) > 25 or not 0 <= int(raw) <= ID_MAX:
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            raise HTTPException(404, f"{name} {shown} is out of range: ids are whole numbers from 0 to {ID_MAX}, "
                                     "so nothing has this one")


def install(app: FastAPI, *, auth_token: str | None, loopback_only: bool) -> None:
    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if loopback_only:
            host = _host_only(request.headers.get("host", "")).lower()
            if host and not is_loopback(host):
                return PlainTextResponse(f"unexpected Host header {host!r} (the dashboard serves loopback only)",
                                         status_code=421)
        if request.method not in SAFE_METHODS:
            reason = cross_site_reason(request)
            if reason:
                if _wants_json(request):
                    return JSONResponse({"detail": reason}, status_code=403)
                return PlainTextResponse(reason, status_code=403)
        if auth_token and not request.url.path.startswith(("/static/", "/login")):
            given = (
                request.cookies.get(TOKEN_COOKIE)
                or request.headers.get("x-synthwatch-token")
                or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            )
            if not given or not hmac.compare_digest(given.encode(), auth_token.encode()):
                if _wants_json(request) or request.headers.get("HX-Request"):
                    return JSONResponse({"detail": "authentication required"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
        response = await call_next(request)
        if response.status_code == 304:  # "not modified" to a poll: no body, nothing for these headers to guard
            return response
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    if auth_token:
        from fastapi.responses import HTMLResponse

        @app.get("/login", include_in_schema=False)
        async def login_form(request: Request) -> Response:
            token = request.query_params.get("token")
            if token and hmac.compare_digest(token.encode(), auth_token.encode()):
                resp = RedirectResponse("/", status_code=303)
                resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
                return resp
            return HTMLResponse(
                "<!doctype html><title>synthwatch login</title><form method=post action=/login>"
                "<label>Token <input name=token type=password autofocus></label> <button>Log in</button></form>",
                status_code=401 if token else 200,
            )

        @app.post("/login", include_in_schema=False)
        async def login(request: Request) -> Response:
            form = await request.form()
            token = str(form.get("token", ""))
            if not hmac.compare_digest(token.encode(), auth_token.encode()):
                return PlainTextResponse("wrong token", status_code=401)
            resp = RedirectResponse("/", status_code=303)
            resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return resp
