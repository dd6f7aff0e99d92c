"""Where an export's rows go: a JSONL or a Parquet file written as ``<out>.partial`` with its sha256."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

PARTIAL_SUFFIX = ".partial"


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.fh = path.open("wb")
        self.hash = hashlib.sha256()

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        data = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)
        self.hash.update(data)
        self.fh.write(data)
        self.fh.flush()  # a page at a time: the partial file shows real progress

    def close(self) -> str:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        return self.hash.hexdigest()

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.fh.close()


class ParquetSink:
    def __init__(self, path: Path, logprobs: bool = False) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.path = path
        fields = [
            ("id", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("prompt_len", pa.int32()),
            ("source", pa.string()),
        ]
        if logprobs:  # the run asked for sampling.logprobs (export/logprobs.py): null on a record without them
            fields += [("completion_logprobs", pa.list_(pa.float32())),
                       ("completion_top_ids", pa.list_(pa.list_(pa.int32()))),
                       ("completion_top_logprobs", pa.list_(pa.list_(pa.float32())))]
        self.schema = pa.schema(fields)
        self.writer = pq.ParquetWriter(str(path), self.schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        table = self.pa.Table.from_pylist(rows, schema=self.schema)
        self.writer.write_table(table)  # one row group per page

    def close(self) -> str:
        self.writer.close()
        with self.path.open("rb") as fh:
            os.fsync(fh.fileno())
            return _sha256_file(fh)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def _sha256_file(fh: Any) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


