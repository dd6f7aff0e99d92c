"""Reading the files of a watched run: following a growing JSONL file like ``tail -F`` (rotation,
truncation, a resumed position), and importing finished files in batches. Lines go to an Ingestor (watch.py).

Following works like ``tail -F`` by polling: complete lines are read with ``pread`` from the
stored offset (a half-written last line is simply not consumed yet); the file's (dev, inode) is
compared with the path's on every idle poll: a rename + new file is detected, the old file is
finished through the still-open descriptor, then the new file is read from its start; a file
that shrinks below the offset (truncation, copytruncate rotation) is read again from 0.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .watch import READ_CHUNK, BatchResult, Ingestor, split_lines


class Follower:
    """Follows one path like ``tail -F`` and feeds complete lines to an :class:`Ingestor`."""

    def __init__(self, ingestor: Ingestor, path: str, *, poll_interval_s: float = 0.2, from_end: bool = False,
                 max_batch_lines: int = 2000, rotate_grace_s: float = 2.0,
                 say: Callable[[str], None] = lambda s: None,
                 on_batch: Callable[[str, BatchResult], None] | None = None) -> None:
        self.ing = ingestor
        self.path = path
        self.poll_interval_s = poll_interval_s
        self.from_end = from_end
        self.max_batch_lines = max_batch_lines
        self.rotate_grace_s = rotate_grace_s
        self.say = say
        self.on_batch = on_batch
        self.stop_event = threading.Event()
        self.fd: int | None = None
        self.fd_id: tuple[int, int] | None = None
        self.display = path
        self.src = ingestor.source(path)
        self._rotated_at: float | None = None
        self._last_touch = 0.0
        self._last_control = 0.0
        self.stopped_by: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self.stop_event.set()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def run(self) -> str:
        """Follow until stop() or a stop control; returns why it ended ("signal", "stop", ...)."""
        try:
            self._open_first()
            while not self.stop_event.is_set():
                if self._control() in ("stop", "stop_now"):
                    self.stopped_by = "stop control"
                    break
                if self.fd is None:
                    self._wait_for_file()
                    continue
                n = self.poll_once()
                if n == 0:
                    self.stop_event.wait(self.poll_interval_s)
        finally:
            self.close()
        return self.stopped_by or "signal"

    def _control(self) -> str:
        m = time.monotonic()
        if m - self._last_control < 0.5:
            return "run"
        self._last_control = m
        desired = self.ing.desired()
        if desired == "pause":
            self.ing.set_status("paused", f"paused: {self.path} is not read until resumed")
            self.say("paused from the dashboard: not reading until resumed")
            while desired == "pause" and not self.stop_event.is_set():
                self.stop_event.wait(0.5)
                desired = self.ing.desired()
            if desired == "run":
                self.ing.set_status("running", f"watching {self.path}")
                self.say("resumed")
        return desired

    # ------------------------------------------------------------------ opening

    def _open_first(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            old = self._find_inode(self.src.dev, self.src.inode) if self.src.inode is not None else None
            if old is not None:
                self.say(f"{self.path} was renamed to {old} while we were away: finishing it first")
                self._finish_file(old)
            self.say(f"{self.path} does not exist yet: waiting for it")
            return
        src = self.src
        if src.inode is None:  # never read: a new watch
            offset, line_no = (self._end_position() if self.from_end else (0, 0))
            if self.from_end:
                self.say(f"{self.path}: starting at the end (line {line_no + 1}); earlier lines are not ingested")
            self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=offset, line_no=line_no,
                                size=st.st_size)
        elif (st.st_dev, st.st_ino) == (src.dev, src.inode):
            if st.st_size < src.offset:
                self.say(f"{self.path} is shorter ({st.st_size} bytes) than where we stopped ({src.offset}): "
                         "it was truncated; reading it again from the start")
                self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                    event="watch_truncated", detail=f"size {st.st_size} < offset {src.offset}")
            else:
                self.say(f"{self.path}: resuming at line {src.line_no + 1} (byte {src.offset})")
        else:
            old = self._find_inode(src.dev, src.inode)
            if old is not None:
                self.say(f"{self.path} was rotated while we were away: finishing {old} first")
                self._finish_file(old)
            else:
                self.say(f"{self.path} was replaced while we were away and the file we were reading is gone; "
                         "reading the new file from the start")
            self.ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                event="watch_rotated", detail="replaced while watch was not running")
        self._open_fd()

    def _open_fd(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.src.dev, self.src.inode):
            os.close(fd)  # replaced between stat and open: the next poll sees it
            return False
        self.fd, self.fd_id, self.display = fd, (st.st_dev, st.st_ino), self.path
        return True

    def _wait_for_file(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.stop_event.wait(self.poll_interval_s)
            return
        if self.src.inode is None or (st.st_dev, st.st_ino) != (self.src.dev, self.src.inode):
            if self.src.inode is not None:
                self.ing.reposition(self.src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                    event="watch_rotated", detail="new file")
            else:
                self._open_first()
                return
        if not self._open_fd():
            self.stop_event.wait(self.poll_interval_s)

    def _end_position(self) -> tuple[int, int]:
        """Offset just after the last complete line, and how many lines lie before it."""
        lines = 0
        last_nl = -1
        with open(self.path, "rb") as fh:
            pos = 0
            while chunk := fh.read(READ_CHUNK):
                lines += chunk.count(b"\n")
                i = chunk.rfind(b"\n")
                if i >= 0:
                    last_nl = pos + i
                pos += len(chunk)
        return last_nl + 1, lines

    def _find_inode(self, dev: int | None, inode: int | None) -> str | None:
        """Where the file we were reading went (a rename in the same folder, as log rotation does)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            with os.scandir(folder) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == (dev, inode) and e.is_file(follow_symlinks=False):
                        return e.path
        except OSError:
            return None
        return None

    def _finish_file(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.fd, self.display = fd, path
            while self._drain(final=True):
                pass
        finally:
            os.close(fd)
            self.fd = None

    # ------------------------------------------------------------------ polling

    def poll_once(self) -> int:
        """Read what is new; handle truncation and rotation when idle. Returns lines consumed."""
        assert self.fd is not None
        n = self._drain(final=False)
        if n:
            self._rotated_at = None
            return n
        size = os.fstat(self.fd).st_size
        if size < self.src.offset:
            self.say(f"{self.path} was truncated ({size} bytes < offset {self.src.offset}): reading again from 0")
            self.ing.reposition(self.src, dev=self.src.dev, inode=self.src.inode, offset=0, line_no=0, size=size,
                                event="watch_truncated", detail=f"size {size} < offset {self.src.offset}")
            return 1
        try:
            st = os.stat(self.path)
            now_id: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            now_id = None
        if now_id is not None and now_id != self.fd_id:
            # renamed and replaced: finish the old file (waiting briefly for a half-written last line)
            m = time.monotonic()
            if self._rotated_at is None:
                self._rotated_at = m
            if size > self.src.offset and m - self._rotated_at < self.rotate_grace_s:
                return 0
            while self._drain(final=True):
                pass
            old = self.src.line_no
            self.close()
            self.ing.reposition(self.src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                                event="watch_rotated", detail=f"previous file ended at line {old}")
            self.say(f"{self.path} was rotated (previous file ended at line {old}): following the new file")
            self._rotated_at = None
            self._open_fd()
            return 1
        if time.monotonic() - self._last_touch > 5 and size != self.src.size:
            self._last_touch = time.monotonic()
            self.ing.touch(self.src, size)
        return 0

    def _drain(self, *, final: bool) -> int:
        """Ingest every complete line available now (batch by batch). Returns lines consumed."""
        assert self.fd is not None
        total = 0
        while True:
            size = os.fstat(self.fd).st_size
            avail = size - self.src.offset
            if avail <= 0:
                return total
            want = min(avail, READ_CHUNK)
            data = os.pread(self.fd, want, self.src.offset)
            while b"\n" not in data and len(data) < avail:  # one line longer than the chunk
                want = min(avail, want * 2)
                data = os.pread(self.fd, want, self.src.offset)
            lines = split_lines(data, self.src.offset, self.src.line_no, final=final and len(data) == avail)
            if not lines:
                return total
            for i in range(0, len(lines), self.max_batch_lines):
                batch = lines[i:i + self.max_batch_lines]
                res = self.ing.commit(self.src, batch, size=size, display_path=self.display)
                if self.on_batch:
                    self.on_batch(self.display, res)
                total += len(batch)
                if self.stop_event.is_set():
                    return total


# ============================================================================ import


def open_sequential(path: Path) -> Any:
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115


def import_file(ing: Ingestor, path: Path, *, max_batch_lines: int = 2000, say: Callable[[str], None] = lambda s: None,
                on_batch: Callable[[str, BatchResult], None] | None = None) -> tuple[int, int, int, bool]:
    """Read a finished file (plain or gzip) from its stored offset to the end.

    Returns (ok, error, bad, resumed_from_a_stored_offset)."""
    key = str(path.resolve())
    src = ing.source(key)
    st = path.stat()
    gz = False
    with open(path, "rb") as probe:
        gz = probe.read(2) == b"\x1f\x8b"
    resumed = False
    if src.inode is not None and (st.st_dev, st.st_ino) == (src.dev, src.inode) and (gz or st.st_size >= src.offset):
        resumed = src.offset > 0
    elif src.inode is not None:
        say(f"{path} changed since it was last imported into this run: reading it again from the start")
        ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size,
                       event="import_changed", detail=str(path))
    else:
        ing.reposition(src, dev=st.st_dev, inode=st.st_ino, offset=0, line_no=0, size=st.st_size)
    ok = err = bad = 0
    with open_sequential(path) as fh:
        if src.offset:
            fh.seek(src.offset)
        buf = b""
        buf_at = src.offset
        for chunk in _chunks(fh):
            buf += chunk
            lines = split_lines(buf, buf_at, src.line_no, final=False)
            if lines:
                for i in range(0, len(lines), max_batch_lines):
                    res = ing.commit(src, lines[i:i + max_batch_lines], size=st.st_size, display_path=str(path))
                    ok, err, bad = ok + res.ok, err + res.error, bad + len(res.bad)
                    if on_batch:
                        on_batch(str(path), res)
                consumed = lines[-1].end - buf_at
                buf, buf_at = buf[consumed:], lines[-1].end
        if buf:
            lines = split_lines(buf, buf_at, src.line_no, final=True)
            res = ing.commit(src, lines, size=st.st_size, display_path=str(path))
            ok, err, bad = ok + res.ok, err + res.error, bad + len(res.bad)
            if on_batch:
                on_batch(str(path), res)
    return ok, err, bad, resumed


def _chunks(fh: Any) -> Iterator[bytes]:
    while chunk := fh.read(READ_CHUNK):
        yield chunk
