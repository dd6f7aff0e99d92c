"""Request-scoped dependencies: database engines, templates, htmx detection."""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..store import search_index

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PACKAGE / "templates"
STATIC_DIR = PACKAGE / "static"


def make_templates(db_url: str | None = None) -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
    # autoescape is on for .html (Starlette's default); model text is never marked safe
    env = templates.env
    env.autoescape = True
    from ..hints import command
    from . import filters

    filters.install(env)
    # every command a page prints (#37): {{ hint("control", "resume", run=run.name) }}, with this database
    env.globals["hint"] = functools.partial(command, db=db_url)
    return templates


def get_read_engine(request: Request) -> Engine:
    return request.app.state.read_engine  # type: ignore[no-any-return]


def get_write_engine(request: Request) -> Engine:
    return request.app.state.write_engine  # type: ignore[no-any-return]


def get_conn(request: Request) -> Iterator[Connection]:
    """A short read connection; never holds a write lock."""
    with request.app.state.read_engine.connect() as conn:
        yield conn


def catch_up_search(request: Request, q: str | None) -> int:
    """Before a search on SQLite: index queued records for a bounded time. Returns how many are still queued
    (0 without a search), so a page can say that they are not searchable yet instead of missing them silently."""
    write: Engine = request.app.state.write_engine
    if not (q or "").strip() or not search_index.applies(write):
        return 0
    settings = request.app.state.settings
    try:
        if search_index.catch_up(write, settings.search_catch_up_ms, settings.search_index_lock_ms):
            return 0
    except DBAPIError as exc:  # busy or disk full: search what is indexed, and say how much is not
        log.warning("search index catch-up failed: %s", getattr(exc, "orig", exc))
    with request.app.state.read_engine.connect() as conn:
        return search_index.backlog(conn)


def search_backlog(request: Request) -> int:
    return catch_up_search(request, request.query_params.get("q"))


def get_templates(request: Request) -> Jinja2Templates:
    return request.app.state.templates  # type: ignore[no-any-return]


def is_htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"


ReadConn = Annotated[Connection, Depends(get_conn)]
WriteEngine = Annotated[Engine, Depends(get_write_engine)]
ReadEngine = Annotated[Engine, Depends(get_read_engine)]
Templates = Annotated[Jinja2Templates, Depends(get_templates)]
HX = Annotated[bool, Depends(is_htmx)]
SearchBacklog = Annotated[int, Depends(search_backlog)]


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Any:
    templates: Jinja2Templates = request.app.state.templates
    ctx = {"settings": request.app.state.settings, **context}
    return lean(request, templates.TemplateResponse(request, name, ctx, status_code=status_code))


GZIP_MIN_BYTES = 1024


def lean(request: Request, response: Response) -> Response:
    """Send a page or fragment only when it changed, and compressed.

    A GET answer carries an ETag of its body and ``Cache-Control: no-cache``: a poll that asks again (the
    browser revalidates on its own, htmx sees the cached body) gets a bodiless 304 while nothing changed.
    Bodies of a kilobyte or more go gzip-compressed to clients that accept it."""
    body = bytes(response.body)
    if request.method != "GET" or response.status_code != 200:
        return _gzip(request, response, body)
    etag = 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    vary = "Accept-Encoding, HX-Request, HX-Target"
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": "no-cache", "Vary": vary})
    response.headers["ETag"] = etag
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Vary"] = vary
    return _gzip(request, response, body)


def _gzip(request: Request, response: Response, body: bytes) -> Response:
    if len(body) < GZIP_MIN_BYTES or "gzip" not in request.headers.get("accept-encoding", ""):
        return response
    # a large page (a record's 1 Mi-character window, #34) at level 1: ~4x faster for a few % more bytes
    packed = gzip.compress(body, compresslevel=6 if len(body) < 1 << 18 else 1)
    response.body = packed
    response.headers["Content-Encoding"] = "gzip"
    response.headers["Content-Length"] = str(len(packed))
    if "Vary" not in response.headers:
        response.headers["Vary"] = "Accept-Encoding"
    return response
