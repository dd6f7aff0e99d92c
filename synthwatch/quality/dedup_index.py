"""`--dedup-against FILE`: the MinHash index of an existing dataset, built once and kept beside the database (#38).

The run's answers (the near-duplicate check's ``field``) are checked against the texts of an existing dataset, JSONL
or Parquet: an answer that is a near-duplicate of one of its rows fails ``near_duplicate`` ("near-duplicate of row N
of FILE"). The run's prompts are not checked (they are the run's own input).

The file is read as a stream (JSONL line by line, Parquet in record batches): memory holds one batch, never the
file. Its signatures go to an index file next to the database (``<db>.dedup-<12 hex of the file's path>.idx``; a
PostgreSQL database: under ``$XDG_CACHE_HOME/synthwatch/dedup``), written to a temporary file and renamed into place.
The index records the SHA-256 of the dataset's content and a key of the shingling settings; an index whose key
differs (the file or the settings changed), or that does not read back whole (its payload's SHA-256), is rebuilt,
never trusted. A missing file, a row that is not a JSON object, a missing column or a value that is not text is
:class:`DedupInputError`: one line naming the file and the row (the command exits 2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..check_catalog import CheckSettings
from ..check_extended import NearDuplicateSettings
from ..store.fresh import sqlite_path
from .checks import ChecksConfigError
from .neardup import Signer

log = logging.getLogger("synthwatch.checks")

MAGIC = b"SWDEDUP1"
FORMAT = 1
BATCH_ROWS = 1000
AUTO_COLUMNS = ("completion", "response", "output", "answer", "content", "text")
CHAT_COLUMNS = ("messages", "conversations")


class DedupInputError(ChecksConfigError):
    """The --dedup-against file cannot be used: one line naming the file and the row."""


def settings_key(s: NearDuplicateSettings) -> str:
    """What the signatures depend on besides the file: shingling, shingle size, permutations, datasketch's hashing
    scheme, column, min_chars."""
    raw = json.dumps({"format": FORMAT, "shingling": s.shingling, "shingle_size": s.shingle_size,
                      "num_perm": s.num_perm, "scheme": Signer(s).scheme, "column": s.against_column,
                      "min_chars": s.min_chars}, sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def index_path(db_url: str, source: Path) -> Path:
    """Where the index of ``source`` is kept for the database at ``db_url``."""
    tag = hashlib.sha256(str(source).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    db_file = sqlite_path(db_url)
    if db_file:
        p = Path(db_file)
        return p.with_name(f"{p.name}.dedup-{tag}.idx")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "synthwatch" / "dedup"
    db_tag = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return base / f"{db_tag}.dedup-{tag}.idx"


# ------------------------------------------------------------------------------------------ reading the dataset


def _text_of(row: Any, column: str | None, where: str, columns: list[str] | None = None) -> str | None:
    """The row's text (None: nothing to compare, a chat without an assistant message); DedupInputError otherwise."""
    if not isinstance(row, dict):
        raise DedupInputError(f"{where}: not a JSON object")
    names = [column] if column else [c for c in (*AUTO_COLUMNS, *CHAT_COLUMNS) if c in row]
    if not names or names[0] not in row:
        have = ", ".join(str(k)[:40] for k in list(columns or row)[:20]) or "none"
        want = f"no column {column!r}" if column else (f"no text column (looked for {', '.join(AUTO_COLUMNS)}, or "
                                                       f"{' / '.join(CHAT_COLUMNS)}; set [checks.near_duplicate] against_column)")
        raise DedupInputError(f"{where}: {want}; its columns: {have}")
    value = row[names[0]]
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # a chat: its last assistant message
        for m in reversed(value):
            if isinstance(m, dict) and m.get("role") in ("assistant", "gpt") or (
                    isinstance(m, dict) and m.get("from") in ("assistant", "gpt")):
                text = m.get("content", m.get("value"))
                if isinstance(text, str):
                    return text
        return None
    raise DedupInputError(f"{where}: column {names[0]!r} is {type(value).__name__}, not text")


def read_texts(path: Path, column: str | None) -> Iterator[tuple[int, str | None]]:
    """(row number from 1, text) of each row, streamed."""
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq  # noqa: PLC0415 - only for a Parquet file

        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises its own errors for a file that is not Parquet
            raise DedupInputError(f"{path}: not a Parquet file ({str(exc)[:200]})") from None
        names = pf.schema_arrow.names
        pick = column or next((c for c in (*AUTO_COLUMNS, *CHAT_COLUMNS) if c in names), None)
        if pick is None or pick not in names:
            _text_of({k: None for k in names}, column, f"{path} row 1", names)  # raises, naming the columns
        n = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[pick]):
            for value in batch.column(0).to_pylist():
                n += 1
                yield n, _text_of({pick: value}, pick, f"{path} row {n}", names)
        return
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DedupInputError(f"{path} line {n}: not JSON ({str(exc)[:120]})") from None
            yield n, _text_of(row, column, f"{path} line {n}")


# ------------------------------------------------------------------------------------------ the index file


def _read(idx: Path, want: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The index's (rows, hashvalues) if it is whole and made from the same file and settings; None otherwise."""
    try:
        with idx.open("rb") as fh:
            if fh.read(len(MAGIC)) != MAGIC:
                return None
            (hlen,) = struct.unpack("<I", fh.read(4))
            head = json.loads(fh.read(hlen))
            if any(head.get(k) != v for k, v in want.items()):
                return None
            payload = fh.read()
        if hashlib.sha256(payload).hexdigest() != head.get("payload_sha256"):
            return None
        n, perm = int(head["count"]), int(head["num_perm"])
        rec = np.dtype([("row", "<i8"), ("hv", "<u8", (perm,))])
        if len(payload) != n * rec.itemsize:
            return None
        arr = np.frombuffer(payload, dtype=rec)
        return arr["row"], arr["hv"]
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def _build(source: Path, s: NearDuplicateSettings, idx: Path, want: dict[str, Any]) -> int:
    signer = Signer(s)
    rec = np.dtype([("row", "<i8"), ("hv", "<u8", (s.num_perm,))])
    idx.parent.mkdir(parents=True, exist_ok=True)
    tmp = idx.with_name(f"{idx.name}.tmp-{os.getpid()}")
    h = hashlib.sha256()
    count = 0
    try:
        with tmp.open("wb") as body:
            buf = np.zeros(BATCH_ROWS, dtype=rec)
            fill = 0
            for row, text in read_texts(source, s.against_column):
                if text is None or len(text.strip()) < s.min_chars:
                    continue
                if count + fill >= s.max_records:
                    raise DedupInputError(f"{source}: more than {s.max_records:,} rows to index ([checks."
                                          "near_duplicate] max_records bounds the index's memory; raise it)")
                buf[fill] = (row, signer.signature(text).hashvalues)
                fill += 1
                if fill == BATCH_ROWS:
                    data = buf.tobytes()
                    h.update(data)
                    body.write(data)
                    count += fill
                    fill = 0
            data = buf[:fill].tobytes()
            h.update(data)
            body.write(data)
            count += fill
        head = json.dumps({**want, "count": count, "num_perm": s.num_perm, "payload_sha256": h.hexdigest()}).encode()
        with tmp.open("rb") as body, idx.with_name(f"{idx.name}.new-{os.getpid()}").open("wb") as out:
            out.write(MAGIC + struct.pack("<I", len(head)) + head)
            while chunk := body.read(1 << 20):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(idx.with_name(f"{idx.name}.new-{os.getpid()}"), idx)
    finally:
        for t in (tmp, idx.with_name(f"{idx.name}.new-{os.getpid()}")):
            t.unlink(missing_ok=True)
    return count


def _ensure(db_url: str, s: NearDuplicateSettings) -> tuple[Path, bool, dict[str, Any]]:
    if not s.against:
        raise ValueError("no --dedup-against file")
    source = Path(s.against).expanduser()
    if not source.is_file():
        raise DedupInputError(f"{s.against}: no such file (--dedup-against, or [checks.near_duplicate] against)")
    try:
        want = {"source_sha256": file_sha256(source), "settings": settings_key(s)}
    except OSError as exc:
        raise DedupInputError(f"{s.against}: cannot read it ({exc.strerror or exc})") from None
    idx = index_path(db_url, source.resolve())
    if idx.exists() and _read(idx, want) is not None:
        return idx, False, want
    if idx.exists():
        log.info("the dedup index %s is stale or unreadable: building it again", idx)
    try:
        _build(source, s, idx, want)
    except OSError as exc:
        raise DedupInputError(f"{s.against}: cannot index it ({exc.strerror or exc}; index {idx})") from None
    return idx, True, want


def ensure(db_url: str, s: NearDuplicateSettings) -> tuple[Path, bool]:
    """The index of ``s.against`` for this database, built unless a whole one of the same file content and settings
    is there: (its path, whether it was built now). DedupInputError for a file that cannot be used."""
    idx, built, _want = _ensure(db_url, s)
    return idx, built


def load(db_url: str, s: NearDuplicateSettings) -> tuple[np.ndarray, np.ndarray]:
    """(rows, hashvalues) of ``s.against``'s index, built first if missing, stale or corrupt."""
    idx, _built, want = _ensure(db_url, s)
    got = _read(idx, want)
    if got is None:
        raise DedupInputError(f"{s.against}: its index {idx} cannot be read back (written by another process meanwhile?)")
    return got


def prepare(db_url: str, checks: Any) -> str | None:
    """Before a run starts: the index of ``[checks.near_duplicate] against`` built or found whole; the line to print
    (None: no file). ``checks``: the run config's [checks] table."""
    s = CheckSettings.model_validate(checks or {}).near_duplicate
    if not (s.enabled and s.against):
        return None
    idx, built = ensure(db_url, s)
    return f"dedup index of {s.against}: {'built' if built else 'found whole'} ({idx})\n"
