"""Incremental Server-Sent Events parser: HTTP body bytes in, event data payloads out.

Follows the WHATWG event-stream rules that matter for a client reading completions:

- lines end with ``\\n``, ``\\r\\n`` or ``\\r``; an empty line dispatches the event;
- ``data:`` lines (one optional space after the colon) are joined with ``\\n``; a line ``data``
  without a colon is a data line with an empty value;
- comments (``:`` lines) and the other fields (``event``, ``id``, ``retry``, anything else) are
  ignored; an event with no data line produces nothing; a UTF-8 BOM at the start is dropped;
- an event that is not terminated by an empty line before the stream ends is never returned
  (see :meth:`SSEParser.pending` for error messages).

The payloads are returned as they are: ``b"[DONE]"`` is a payload like any other, and an event
``data:`` with an empty value yields ``b""`` (the spec dispatches it); the caller decides.

Hot path: servers send ``data: {...}\\n\\n``. A read holding exactly one such event costs a few
C-level checks and one slice; a read holding several costs one ``split`` on ``\\n\\ndata: `` plus
one newline scan, with no Python work per event. Only events with several lines, comments or
other fields go through a per-line loop. Bytes of an unfinished event are kept as a list of pieces
and joined once a separator arrives, so a huge single event fed in small pieces stays linear.

:attr:`SSEParser.held` is the number of bytes of the unfinished event (what a caller bounds: an
event that never ends would otherwise grow without limit).

``feed`` takes ``bytes`` in whatever pieces the socket delivers them. At end of stream,
call :meth:`SSEParser.flush` (it only matters for a stream ending in a bare ``\\r``) and report
:meth:`SSEParser.pending` if it is not empty: the stream ended mid-event.
"""

from __future__ import annotations

__all__ = ["SSEParser"]

_SEP = b"\n\n"
_SEP_DATA = b"\n\ndata: "
_NL = b"\n"
_DATA_SP = b"data: "
_BOM = b"\xef\xbb\xbf"


class SSEParser:
    """Feed body bytes in arbitrary pieces; get complete event data payloads back, in order."""

    __slots__ = ("_cr_held", "_head", "_parts", "_started", "held")

    def __init__(self) -> None:
        # Unconsumed bytes (line endings already normalized to \n), holding no complete event.
        self._parts: list[bytes] = []
        # The last byte fed was \r: it may be the first half of \r\n, so it waits for the next byte.
        self._cr_held = False
        self._started = False
        self._head = b""  # first bytes of the stream while they could still be a split BOM
        self.held = 0  # bytes in _parts: the unfinished event so far

    def feed(self, data: bytes) -> list[bytes]:
        """Consume ``data``; return the payloads of the events it completed (maybe none)."""
        # Fastest path: nothing pending and `data` is exactly one `data: ...\n\n` event (a server
        # flushes each event, so one read often holds one event).
        n = len(data) - 2
        if (
            data.find(10) == n
            and data[-1] == 10
            and data[:6] == _DATA_SP
            and not self._parts
            and self._started
            and not self._cr_held
            and 13 not in data
        ):
            return [data[6:n]]
        if not data:
            return []
        if not self._started:
            data = self._head + data
            if len(data) < 3 and _BOM.startswith(data):
                self._head = data
                return []
            self._started = True
            self._head = b""
            if data.startswith(_BOM):
                data = data[3:]
                if not data:
                    return []
        # int membership is a plain memchr; a bytes argument costs a buffer acquisition
        if self._cr_held or 13 in data:
            data = self._normalize(data)
            if not data:
                return []
        parts = self._parts
        if parts:
            # A separator in the new bytes, or straddling the old/new boundary? If not, just keep
            # the piece: joining only when an event completes keeps huge events linear.
            if data.find(_SEP) < 0 and not (data[0] == 10 and parts[-1][-1] == 10):
                parts.append(data)
                self.held += len(data)
                return []
            parts.append(data)
            buf = b"".join(parts)
            parts.clear()
            self.held = 0
        else:
            buf = data
        # Everything up to the last "\n\n" is complete lines followed by a blank line.
        end = buf.rfind(_SEP)
        if end < 0:
            parts.append(buf)
            self.held = len(buf)
            return []
        if end + 2 < len(buf):
            parts.append(buf[end + 2 :])
            self.held = len(buf) - end - 2
        if buf[:6] == _DATA_SP:
            if buf.find(10) == end:  # exactly one complete event, one `data: ` line
                return [buf[6:end]]
            # Fast path: split on the whole "\n\ndata: " separator; if no piece holds a newline,
            # every event was exactly one `data: ` line (a comment, another field, a multi-line
            # event or an extra blank line would leave a \n in some piece).
            out = buf[6:end].split(_SEP_DATA)
            if 10 not in b"".join(out):
                return out
            out = []
        else:
            out = []
        _parse_region(buf[:end], out)
        return out

    def pending(self) -> bytes:
        """Bytes fed but not yet part of a complete event (line endings normalized to ``\\n``)."""
        held = b"\r" if self._cr_held else b""
        return self._head + b"".join(self._parts) + held

    def flush(self) -> list[bytes]:
        """At end of stream: a held trailing ``\\r`` is a line end after all (it may finish an event).

        Whatever is still unfinished afterwards stays in :meth:`pending` and is not returned.
        """
        if not self._cr_held:
            return []
        self._cr_held = False
        return self.feed(b"\n")

    def _normalize(self, data: bytes) -> bytes:
        if self._cr_held:
            data = b"\r" + data
            self._cr_held = False
        if data.endswith(b"\r"):
            data = data[:-1]
            self._cr_held = True
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _parse_region(region: bytes, out: list[bytes]) -> None:
    """General path: complete lines (the last one's terminator cut off) followed by a blank line."""
    data: list[bytes] | None = None
    for line in region.split(_NL):
        if not line:
            if data is not None:
                out.append(_NL.join(data))
                data = None
        elif line.startswith(b"data"):
            if len(line) == 4:
                value = b""
            elif line[4] == 58:  # ':'
                value = line[6:] if line[5:6] == b" " else line[5:]
            else:
                continue  # another field whose name starts with "data"
            if data is None:
                data = [value]
            else:
                data.append(value)
        # comments (":...") and other fields are ignored
    if data is not None:
        out.append(_NL.join(data))
