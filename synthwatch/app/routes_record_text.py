"""Routes: the rest of a long field of a record, on demand (#34: viewing is bounded).

The record page shows the first window of each field (review.display.VIEW_WINDOW_CHARS). Beyond it:

- ``GET /runs/{id}/records/{rid}/text/{field}?at=N``: the htmx fragment of the next window from character N, with
  the button for the one after; the database cuts the window (``substr``), the page's work stays one window;
- ``GET /runs/{id}/records/{rid}/download/{field}``: the whole field as a UTF-8 text file, sent in pieces of
  :data:`DOWNLOAD_PIECE_CHARS`, each made only when the one before has been taken by the connection. A client that
  goes away stops the making: Starlette listens for the disconnect while it sends and cancels the sending; the
  download then logs how many pieces it made of how many (``tests/test_viewer_bounded.py`` reads that line).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy import text
from starlette.types import Receive, Scope, Send

from ..review import display as review_display
from .deps import ReadConn, render

router = APIRouter()
log = logging.getLogger("synthwatch.app.download")

FIELDS = ("reasoning", "content")
DOWNLOAD_PIECE_CHARS = 1 << 20
_MAX_AT = 2**40  # far past any stored field; keeps the bound parameter a plain integer on every backend


def _field(field: str) -> str:
    if field not in FIELDS:
        raise HTTPException(404, f"no field {field!r}: one of {', '.join(FIELDS)}")
    return field


@router.get("/runs/{run_id}/records/{record_id:int}/text/{field}", include_in_schema=False)
def text_window(request: Request, run_id: int, record_id: int, field: str, conn: ReadConn,
                at: Annotated[int, Query(ge=0, le=_MAX_AT)] = 0) -> Response:
    col = _field(field)
    size = review_display.VIEW_WINDOW_CHARS
    row = conn.execute(text(f"SELECT substr({col}, :a, :n) AS part, length({col}) AS chars FROM record"
                            " WHERE id = :i AND run_id = :r"), {"a": at + 1, "n": size, "i": record_id,
                                                                "r": run_id}).first()
    if row is None:
        raise HTTPException(404, f"run {run_id} has no record {record_id}")
    part, chars = row.part or "", int(row.chars or 0)
    nxt = at + len(part)
    return render(request, "_viewer_chunk.html", {
        "chunks": review_display.chunks(review_display.segments(part)),
        "next_url": f"/runs/{run_id}/records/{record_id}/text/{col}?at={nxt}" if part and nxt < chars else None,
        "next_chars": chars - nxt, "window_chars": size,
    })


@router.get("/runs/{run_id}/records/{record_id:int}/download/{field}", include_in_schema=False)
def download(run_id: int, record_id: int, field: str, conn: ReadConn) -> Response:
    col = _field(field)
    value = conn.execute(text(f"SELECT {col} FROM record WHERE id = :i AND run_id = :r"),
                         {"i": record_id, "r": run_id}).first()
    if value is None:
        raise HTTPException(404, f"run {run_id} has no record {record_id}")
    return _FieldDownload(value[0] or "", f"run {run_id} record {record_id} {col}", headers={
        "Content-Disposition": f'attachment; filename="run{run_id}-record{record_id}-{col}.txt"',
        "Cache-Control": "no-store"})


class _FieldDownload(StreamingResponse):
    """A field sent in pieces; when the sending ends before the last piece (the client went away, or `serve` is
    stopping), one log line says how many pieces were made: the rest never are."""

    def __init__(self, whole: str, what: str, headers: dict[str, str]) -> None:
        self.what = what
        self.n_pieces = -(-len(whole) // DOWNLOAD_PIECE_CHARS)
        self.made = 0
        super().__init__(self._pieces(whole), media_type="text/plain; charset=utf-8", headers=headers)

    def _pieces(self, whole: str) -> Iterator[bytes]:
        for i in range(0, len(whole), DOWNLOAD_PIECE_CHARS):
            self.made += 1
            yield whole[i: i + DOWNLOAD_PIECE_CHARS].encode("utf-8", "replace")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.made < self.n_pieces:
                log.info("download of %s stopped after %d of %d pieces: the client went away or serve is stopping",
                         self.what, self.made, self.n_pieces)
