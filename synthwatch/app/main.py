"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..export.jobs import ExportJobs, exports_dir
from ..settings import Settings, get_settings
from ..store.db import make_engine, migrate, resolve_url
from ..store.search_index import BackgroundIndexer
from . import security
from .deps import STATIC_DIR, make_templates, render


def create_app(db: str | None = None, settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    url = resolve_url(db or settings.db)
    migrate(url)
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the workers only queue finished records for full-text search; the dashboard indexes them
        indexer = BackgroundIndexer(app.state.write_engine, settings.search_index_interval_ms,
                                    settings.search_index_lock_ms).start()
        app.state.search_indexer = indexer
        try:
            yield
        finally:
            await asyncio.to_thread(indexer.stop)

    app = FastAPI(
        lifespan=lifespan,
        dependencies=[Depends(security.ids_in_range)],  # every route: an id out of range is a 404, not a 500
        title="synthwatch",
        description="Live dashboard and JSON API for synthetic data generation runs.",
        version="0.1.0",
        docs_url=None,  # FastAPI's own /docs loads Swagger UI from a CDN with an inline script: see api_docs below
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db_url = url
    # reads: query_only connections; writes (controls, flags): short transactions on their own pool
    app.state.read_engine = make_engine(url, readonly=True, pool_size=10)
    app.state.write_engine = make_engine(url, pool_size=2)
    app.state.export_jobs = ExportJobs(app.state.read_engine, app.state.write_engine, exports_dir(url))
    app.state.templates = make_templates(url)
    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
    security.install(app, auth_token=settings.auth_token, loopback_only=security.is_loopback(settings.host))
    app.add_middleware(security.BodyLimit, limit=settings.max_request_body_bytes)  # outside the others: first
    _install_error_pages(app)

    from . import (
        routes_alarms,
        routes_cost,
        routes_export,
        routes_fix,
        routes_flags,
        routes_lengths,
        routes_open_items,
        routes_record_text,
        routes_repair,
        routes_review,
        routes_runs,
        routes_server,
        routes_streams,
        routes_workers,
    )

    for mod in (routes_runs, routes_review, routes_flags, routes_alarms, routes_repair, routes_export, routes_workers,
                routes_server, routes_cost, routes_lengths, routes_open_items, routes_fix, routes_streams,
                routes_record_text):
        app.include_router(mod.router)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return RedirectResponse("/runs", status_code=307)

    @app.get("/docs", include_in_schema=False)
    def api_docs(request: Request) -> Response:
        # Swagger UI from the npm registry (package-lock.json), served from static/vendor like htmx
        return render(request, "api_docs.html", {})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        # pages carry <link rel="icon" href="data:,">; a fragment or JSON opened on its own does not, and the
        # browser then asks for this path: answered empty instead of with a 404 in the console and the log
        return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from .metrics import RunsCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunsCollector(app.state.read_engine))

    @app.get("/metrics", tags=["metrics"], summary="Prometheus metrics of every run (docs/metrics.md)")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _install_error_pages(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
        return render(request, "error.html", {"status": exc.status_code, "detail": exc.detail},
                      status_code=exc.status_code)

    @app.exception_handler(OverflowError)
    async def overflow(request: Request, exc: OverflowError) -> Response:
        # a number from the request (a query parameter such as ?like=) the database's 64-bit integers cannot hold;
        # path ids are refused before this (security.ids_in_range)
        detail = f"a number in this request is out of range: ids and counts are whole numbers up to {2**63 - 1}"
        if _wants_json(request):
            return JSONResponse({"detail": detail}, status_code=400)
        return render(request, "error.html", {"status": 400, "detail": detail}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path"))
            problems.append(f"{loc or 'request'}: {err.get('msg')}")
        if _wants_json(request):
            return JSONResponse({"detail": "invalid request", "problems": problems}, status_code=400)
        return render(request, "error.html", {"status": 400, "detail": "invalid request", "problems": problems},
                      status_code=400)
